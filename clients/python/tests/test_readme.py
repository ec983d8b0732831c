"""The README's ten-line example, run as it is printed."""
import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(dsn, conn):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 12
    conn.execute("SELECT queen.delete_queue('emails')")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "QUEEN_DSN": dsn},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sending to ada@example.com"
    # The example's consumer acked it: group mailer has nothing left.
    left = conn.execute("SELECT count(*) FROM queen.pop('emails', 'mailer', batch => 10, auto_ack => true)").fetchone()
    assert left[0] == 0


def test_the_projects_readme_shows_the_same_example():
    main = (README.parents[2] / "README.md").read_text()
    section = main[main.index("### The Python package"):]
    mine = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert re.search(r"```python\n(.*?)```", section, re.S).group(1) == mine
