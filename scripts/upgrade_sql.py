#!/usr/bin/env python3
"""Builds an upgrade script from the install script, so that a function is written once.

    python3 scripts/upgrade_sql.py INSTALL.sql HAND.sql > queen--A--B.sql
    python3 scripts/upgrade_sql.py --self-test

INSTALL.sql is the install script pgrx generates for the new version (from sql/schema.sql,
the Rust entry points and sql/api.sql). HAND.sql is the hand-written part of the upgrade
(sql/upgrade/queen--A--B.sql): table and data changes and DROPs above a line
`-- @functions`, and what must follow the functions below it.

The output is HAND's part above the line, then every function statement of INSTALL in its
order (CREATE FUNCTION made CREATE OR REPLACE FUNCTION; COMMENT ON FUNCTION; GRANT and
REVOKE on functions; ALTER FUNCTION; the grants table, `DO $grants$`; the roles, `DO
$roles$`, and their USAGE on the schema), and the list of
tables a dump holds (`SELECT pg_catalog.pg_extension_config_dump(...)`, which may run
again: it replaces a table's entry), then HAND's part below the line. As PgQ's
upgrade.sql and timescaledb-toolkit's update-script generator do: a function body lives in
one place, and the upgrade re-creates every function. A function whose arguments, result
type or argument names changed cannot be replaced: HAND drops it first.
scripts/upgrade_test.sh compares the upgraded catalog with a fresh install.

The splitter knows quotes, double quotes, dollar quotes and comments, which is all the
install script uses; it does not know E'' strings with backslash escapes or BEGIN ATOMIC
bodies (neither appears in queen's SQL; the upgrade test would fail if one did).
"""

import re
import sys

MARKER = "-- @functions"
# A dollar quote's opening tag ($$ or $tag$), not inside an identifier.
DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")

# Statements of the install script that belong to functions.
FUNCTION_STATEMENT = re.compile(
    r"^(CREATE\s+(OR\s+REPLACE\s+)?FUNCTION"
    r"|COMMENT\s+ON\s+FUNCTION"
    r"|GRANT\s+.*?\s+ON\s+(ALL\s+FUNCTIONS|FUNCTION)"
    r"|REVOKE\s+.*?\s+ON\s+(ALL\s+FUNCTIONS|FUNCTION)"
    r"|ALTER\s+FUNCTION"
    r"|DO\s+\$grants\$"
    r"|DO\s+\$roles\$"
    r"|GRANT\s+USAGE\s+ON\s+SCHEMA\s+queen\s+TO"
    r"|SELECT\s+pg_catalog\.pg_extension_config_dump\s*\()",
    re.IGNORECASE | re.DOTALL,
)


def statements(sql):
    """Splits SQL text into statements (each with its terminating semicolon), honouring
    quotes, double quotes, dollar quotes and comments. Comments between statements are
    dropped."""
    out, cur, i, n = [], [], 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            if "".join(cur).strip():
                cur.append(sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if "".join(cur).strip():
                cur.append(sql[i:j])
            i = j
        elif c in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            cur.append(sql[i : j + 1])
            i = j + 1
        elif c == "$" and DOLLAR.match(sql, i) and not (i and re.match(r"\w", sql[i - 1])):
            tag = DOLLAR.match(sql, i).group(0)
            j = sql.find(tag, i + len(tag))
            if j < 0:
                raise SystemExit(f"upgrade_sql: unterminated {tag} quote")
            cur.append(sql[i : j + len(tag)])
            i = j + len(tag)
        elif c == ";":
            text = "".join(cur).strip()
            if text:
                out.append(text + ";")
            cur, i = [], i + 1
        else:
            cur.append(c)
            i += 1
    if "".join(cur).strip():
        raise SystemExit("upgrade_sql: the last statement has no semicolon")
    return out


def function_part(install_sql):
    """Every function statement of the install script, in order, ready to run again."""
    out = []
    for st in statements(install_sql):
        if not FUNCTION_STATEMENT.match(st):
            continue
        st = re.sub(r"^CREATE\s+FUNCTION", "CREATE OR REPLACE FUNCTION", st, flags=re.IGNORECASE)
        out.append(st)
    return out


def build(install_sql, hand_sql, install_name="the install script"):
    if hand_sql.count(MARKER + "\n") != 1:
        raise SystemExit(f"upgrade_sql: the hand-written part needs exactly one line '{MARKER}'")
    before, after = hand_sql.split(MARKER + "\n")
    funcs = function_part(install_sql)
    if not funcs:
        raise SystemExit(f"upgrade_sql: {install_name} holds no function")
    body = "\n\n".join(funcs)
    return (
        before.rstrip("\n")
        + f"\n\n-- Every function of {install_name}, generated by scripts/upgrade_sql.py.\n\n"
        + body
        + "\n\n-- End of the generated part.\n\n"
        + after.lstrip("\n")
    )


def self_test():
    install = """
CREATE TABLE queen.t (a int);  -- a table: not a function
/* pgrx comment; with a semicolon */
CREATE  FUNCTION "f"("x" TEXT DEFAULT 'a;b') RETURNS int
LANGUAGE c AS 'MODULE_PATHNAME', 'f_wrapper';
COMMENT ON FUNCTION queen.f IS 'it''s f; really';
GRANT EXECUTE ON FUNCTION queen.f TO queen_admin;
CREATE OR REPLACE FUNCTION queen.g() RETURNS text LANGUAGE plpgsql AS $body1$
BEGIN RETURN 'x;y' || $$;$$; END $body1$;
ALTER FUNCTION queen.g() SET search_path = pg_catalog;
CREATE TYPE queen.ty AS (a int);
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queen FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA queen FROM PUBLIC;
DO $grants$ BEGIN EXECUTE 'GRANT EXECUTE ON FUNCTION queen.f TO r;'; END $grants$;
DO $other$ BEGIN NULL; END $other$;
SELECT pg_catalog.pg_extension_config_dump('queen.t', 'WHERE a > 0; -- not the end');
SELECT 2;
"""
    hand = "ALTER TABLE queen.t ADD COLUMN b int;\n-- @functions\nSELECT 1;\n"
    out = build(install, hand)
    parts = function_part(install)
    assert len(parts) == 8, parts
    assert parts[6].startswith("DO $grants$") and "queen.f TO r;'" in parts[6], parts[6]
    assert parts[7] == "SELECT pg_catalog.pg_extension_config_dump('queen.t', 'WHERE a > 0; -- not the end');", parts[7]
    assert "SELECT 2;" not in out, out
    assert parts[0].startswith('CREATE OR REPLACE FUNCTION "f"') and "'a;b'" in parts[0], parts[0]
    assert parts[1] == "COMMENT ON FUNCTION queen.f IS 'it''s f; really';", parts[1]
    assert "$body1$\nBEGIN RETURN 'x;y' || $$;$$; END $body1$;" in parts[3], parts[3]
    assert parts[5].startswith("REVOKE ALL ON ALL FUNCTIONS"), parts[5]
    assert "CREATE TABLE" not in out and "CREATE TYPE" not in out and "ALL TABLES" not in out, out
    assert "$other$" not in out, out
    assert out.index("ADD COLUMN b") < out.index("CREATE OR REPLACE FUNCTION") < out.index("SELECT 1;"), out
    for bad in ["SELECT 1;\n", "-- @functions\n-- @functions\n"]:
        try:
            build(install, bad)
        except SystemExit:
            continue
        raise AssertionError(f"accepted a hand part without exactly one marker: {bad!r}")
    print(
        "upgrade_sql.py self-test: functions and dumped tables kept in order with quotes intact; "
        "tables and types left out"
    )


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    install_path, hand_path = sys.argv[1], sys.argv[2]
    with open(install_path) as f:
        install = f.read()
    with open(hand_path) as f:
        hand = f.read()
    sys.stdout.write(build(install, hand, install_path.rsplit("/", 1)[-1]))


if __name__ == "__main__":
    main()
