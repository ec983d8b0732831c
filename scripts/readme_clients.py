"""Checks that every README code block whose info string names a file under clients/
(```python clients/python/core_loop.py) is that file, verbatim."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = (root / "README.md").read_text()
blocks = re.findall(r"^```\w+ (clients/\S+)\n(.*?)^```$", readme, flags=re.S | re.M)
if not blocks:
    sys.exit("readme_clients: no client example in README.md")
for path, body in blocks:
    if (root / path).read_text() != body:
        sys.exit(f"readme_clients: README's copy of {path} differs from the file")
print(f"readme_clients: {len(blocks)} examples match their files")
