#!/usr/bin/env python3
"""Prints the README's SQL tour (the ```sql blocks between the tour markers) verbatim,
so that pg_regress runs exactly what the README shows."""
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
start = text.index("<!-- tour:start -->")
end = text.index("<!-- tour:end -->")
blocks = re.findall(r"```sql\n(.*?)```", text[start:end], re.S)
if not blocks:
    sys.exit("README has no SQL tour")
# A clean start, whatever ran before in the regression database.
print("-- generated from README.md by scripts/readme_sql.py; do not edit")
print("SET client_min_messages = warning;")
print("DROP EXTENSION IF EXISTS queen CASCADE;")
print("RESET client_min_messages;")
print("\n".join(b.rstrip("\n") + "\n" for b in blocks), end="")
