#!/usr/bin/env python3
"""The declared layering of queen's two crates, checked (`make lint` runs this).

Each module of `src/` and `core/src/` belongs to one room; rooms are listed bottom first.
A module may use modules of its own room and of the rooms below it, never of a room above,
and no set of modules may import each other in a circle. docs/architecture.md explains
the rooms. A new module must be given a room here, or the check fails.

An import is any `crate::<module>` in a file (a `use` line, a `use crate::{...}` group or
an inline path), outside comment lines and its `#[cfg(test)] mod tests` block. (`super::`
paths are not followed: the crates use them only inside test modules.)

    python3 scripts/layers.py             check both crates
    python3 scripts/layers.py --self-test show that an upward import and a cycle fail
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# src/: PostgreSQL plumbing at the bottom, entry points at the top.
SRC_ROOMS = [
    # PostgreSQL plumbing and leaf helpers: import nothing of queen's above them.
    ("pg", "errors spi srf heap jsonb shmem catalog cache clock settings ids failpoints deferred wake"),
    # Services the domain uses: Citus routing, encryption, durability, per-database
    # slots and counters, lock helpers, name checks.
    ("services", "names citus encryption durability dbs stats locks"),
    # The domain: partition offsets, segments and generations (storage), lanes (registry
    # and rows), queues, groups' creation, privileges.
    ("domain", "offsets segments generations lane_rows lanes queues privileges"),
    # What the SQL functions do, over the domain.
    ("operations", "push pop ack dlq churn compaction retention"),
    # Entry points: SQL wrappers, the background workers, hooks, the crate root.
    ("entry", "api worker hooks lib pg_tests"),
]

# core/src/: pure Rust.
CORE_ROOMS = [
    ("base", "fail ids names lease lock_order envelope segment routing claim dedup generations compaction table"),
    ("rules", "policy ack lane"),
    ("registries", "lanes offsets"),
    ("crate", "lib"),
]


def strip_tests(text):
    """The file without its `#[cfg(test)] mod tests { ... }` block (test-only imports)."""
    m = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)
    if not m:
        return text
    depth, i = 0, m.end() - 1
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[: m.start()] + text[i + 1 :]
        i += 1
    return text[: m.start()]


def module_of(path, base):
    rel = path.relative_to(base)
    return rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]


def graph(files):
    """{module: set of modules it imports}, from {module: [file texts]}."""
    g = {}
    for mod, texts in files.items():
        deps = set()
        for text in texts:
            text = strip_tests(text)
            # Comment lines (doc comments name modules without importing them).
            text = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("//"))
            deps |= set(re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", text))
            for m in re.finditer(r"use crate::\{", text):
                deps |= top_level_names(text, m.end())
        g[mod] = {d for d in deps if d != mod}
    for mod in g:
        g[mod] &= set(g)
    return g


def top_level_names(text, start):
    """The first path segment of each item of a `use crate::{...}` group that opens just
    before `start`: `{a::{b, c}, d}` gives a and d."""
    names, depth, item, i = set(), 0, "", start
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            names.add(item.strip().split("::")[0])
            item = ""
            i += 1
            continue
        if depth == 0:
            item += c
        i += 1
    names.add(item.strip().split("::")[0])
    return {n for n in names if n}


def cycles(g):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def check(crate, files, rooms):
    """Problems found in one crate, as messages (empty: the layering holds)."""
    level = {}
    for i, (_, mods) in enumerate(rooms):
        for m in mods.split():
            level[m] = i
    g = graph(files)
    problems = []
    for m in sorted(g):
        if m not in level:
            problems.append(f"{crate}: module {m} has no room (scripts/layers.py)")
    for m in sorted(g):
        for d in sorted(g[m]):
            if m in level and d in level and level[d] > level[m]:
                problems.append(
                    f"{crate}: {m} ({rooms[level[m]][0]}) imports {d} ({rooms[level[d]][0]}), a room above it"
                )
    for comp in cycles(g):
        problems.append(f"{crate}: import cycle among {', '.join(comp)}")
    for m in sorted(level):
        if m not in g:
            problems.append(f"{crate}: scripts/layers.py names {m}, which does not exist")
    return problems


def read_crate(base):
    files = {}
    for path in sorted(base.rglob("*.rs")):
        files.setdefault(module_of(path, base), []).append(path.read_text())
    return files


def self_test():
    rooms = [("low", "a b"), ("high", "c")]
    ok = {"a": ["use crate::b;"], "b": [""], "c": ["crate::a::f();"]}
    assert check("t", ok, rooms) == [], check("t", ok, rooms)
    upward = {"a": ["use crate::c::X;"], "b": [""], "c": [""]}
    assert any("a room above" in p for p in check("t", upward, rooms))
    nested = {"a": ["use crate::{b::{X, Y}, c};"], "b": [""], "c": [""]}
    assert any("a (low) imports c" in p for p in check("t", nested, rooms)), check("t", nested, rooms)
    commented = {"a": ["/// see crate::c::f\n// crate::c too\nfn f() {}"], "b": [""], "c": [""]}
    assert check("t", commented, rooms) == []
    circle = {"a": ["use crate::b;"], "b": ["use crate::{a, c};"], "c": [""]}
    found = check("t", circle, rooms)
    assert any("cycle among a, b" in p for p in found) and any("a room above" in p for p in found), found
    in_tests = {"a": ["fn f() {}\n#[cfg(test)]\nmod tests { use crate::c; }"], "b": [""], "c": [""]}
    assert check("t", in_tests, rooms) == []
    unknown = {"a": [""], "b": [""], "c": [""], "d": [""]}
    assert any("d has no room" in p for p in check("t", unknown, rooms))
    print("layers.py self-test: an upward import, a cycle and a module without a room are caught")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return 0
    problems = check("src", read_crate(ROOT / "src"), SRC_ROOMS)
    problems += check("core", read_crate(ROOT / "core" / "src"), CORE_ROOMS)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print("layers: src and core follow their declared rooms, with no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
