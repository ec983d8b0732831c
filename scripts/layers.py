#!/usr/bin/env python3
"""The declared layering of queen's two crates, checked (`make lint` runs this).

A module is a file: `src/pg/errors.rs` is `pg::errors`, `src/hooks.rs` is `hooks`, a
`mod.rs` is its directory. Each module belongs to the room named by its first path part;
rooms are listed bottom first. In `src/` the rooms are directories (`pg/`, `lane/`, ...)
plus the entry points at the top; `core/src/` is flat and its rooms list its files. A
module may use modules of its own room and of the rooms below it, never of a room above,
and no set of modules may import each other in a circle. docs/architecture.md explains the
rooms. A new directory or a new core module must be given a room here, or the check fails.

An import is any `crate::` path in a file (a `use` line, a `use crate::{...}` tree or an
inline path), outside comment lines and its `#[cfg(test)] mod tests` block; it names the
longest module its path starts with. A file-level `super::` path (or `super::super::`)
outside a test module is refused: it would import without naming the room it reaches.
An indented `super::` inside an inline module of the same file stays in that file.

    python3 scripts/layers.py             check both crates
    python3 scripts/layers.py --self-test show that an upward import and a cycle fail
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# src/: PostgreSQL plumbing at the bottom, entry points at the top. Each room is a
# directory of src/, but `offsets` (one file, src/offsets.rs) and the entry points (api/
# and the top-level files).
SRC_ROOMS = [
    # PostgreSQL plumbing and leaf services: errors, SPI, shared memory, caches, settings,
    # per-database slots, lock helpers. Imports nothing of queen's above it.
    ("pg", "pg"),
    # The partition offsets registry: reserved, committed and readable ends (src/offsets.rs).
    ("offsets", "offsets"),
    # Lanes: the lane registry in shared memory and the lane rows.
    ("lane", "lane"),
    # Segments, generations, compaction, retention, churn.
    ("storage", "storage"),
    # Queue lookup and creation, names, privileges, encryption, Citus routing.
    ("queue", "queue"),
    # What push, pop and ack do, and the dead-letter writes.
    ("ops", "ops"),
    # Entry points: SQL wrappers (api/), hooks, the background workers, the crate root.
    ("entry", "api hooks worker lib pg_tests"),
]

# core/src/: pure Rust, flat.
CORE_ROOMS = [
    ("base", "fail ids names addresses lease lock_order envelope segment routing claim dedup generations compaction table"),
    ("rules", "policy ack lane overflow backoff"),
    ("registries", "lanes offsets limits"),
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
    parts = list(path.relative_to(base).parts)
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "mod" and len(parts) > 1:
        parts.pop()
    return "::".join(parts)


def paths_in(text):
    """Every `crate::` path of a text, as `a::b::c` strings, `use crate::{...}` trees expanded."""
    found = [m.group(1)[2:] for m in re.finditer(r"\bcrate((?:::[a-z_][a-z0-9_]*)+)", text)]
    for m in re.finditer(r"\bcrate((?:::[a-z_][a-z0-9_]*)*)::\{", text):
        prefix = m.group(1)[2:]
        found += [f"{prefix}::{p}" if prefix else p for p in tree(text, m.end())]
    return found


def tree(text, start):
    """The paths of a use tree whose `{` opens just before `start`: `{a::{b, c}, d}` gives
    a::b, a::c and d."""
    out, item, i = [], "", start
    while i < len(text):
        c = text[i]
        if c == "{":
            head = item.strip().rstrip(":").strip()
            inner, i = tree(text, i + 1), i
            depth = 1
            i += 1
            while depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            out += [f"{head}::{p}" if head else p for p in inner]
            item = ""
            continue
        if c == "}":
            break
        if c == ",":
            if item.strip():
                out.append(item.strip())
            item = ""
        else:
            item += c
        i += 1
    if item.strip():
        out.append(item.strip())
    return [re.sub(r"\s+as\s+\w+$", "", p).replace(" ", "") for p in out if p.strip()]


def resolve(path, modules):
    """The longest module a path starts with, or None."""
    parts = path.split("::")
    for n in range(len(parts), 0, -1):
        if "::".join(parts[:n]) in modules:
            return "::".join(parts[:n])
    return None


def graph(files):
    """{module: set of modules it imports}, from {module: [file texts]}."""
    g = {}
    for mod, texts in files.items():
        deps = set()
        for text in texts:
            text = strip_tests(text)
            # Comment lines (doc comments name modules without importing them).
            text = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("//"))
            deps |= {resolve(p, files) for p in paths_in(text)}
        g[mod] = {d for d in deps if d and d != mod}
    return g


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

    def room(m):
        return level.get(m.split("::")[0])

    problems = []
    for m in sorted(g):
        if room(m) is None:
            problems.append(f"{crate}: module {m} has no room (scripts/layers.py)")
    for m in sorted(g):
        for d in sorted(g[m]):
            if room(m) is not None and room(d) is not None and room(d) > room(m):
                problems.append(
                    f"{crate}: {m} ({rooms[room(m)][0]}) imports {d} ({rooms[room(d)][0]}), a room above it"
                )
    for comp in cycles(g):
        problems.append(f"{crate}: import cycle among {', '.join(comp)}")
    for m, texts in sorted(files.items()):
        for text in texts:
            code = "\n".join(l for l in strip_tests(text).split("\n") if not l.lstrip().startswith("//"))
            # A file-level super:: (unindented) names the parent directory's module, and
            # super::super:: climbs further; an indented one inside an inline module of the
            # same file stays in the file.
            if re.search(r"^\S.*\bsuper::|\bsuper::super::", code, re.M):
                problems.append(f"{crate}: {m} uses a super:: path outside its tests (name the module with crate::)")
    tops = {m.split("::")[0] for m in g}
    for m in sorted(level):
        if m not in tops:
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
    # Directories: a module is a path; a tree names the modules inside the directory.
    dirs = {"a": [""], "a::x": ["use crate::a::y;"], "a::y": ["use crate::{c::z as w, a::{x}};"],
            "b": [""], "c": [""], "c::z": [""]}
    found = check("t", dirs, rooms)
    assert any("a::y (low) imports c::z (high)" in p for p in found), found
    assert any("cycle among a::x, a::y" in p for p in found), found
    sneaky = {"a": [""], "a::x": ["use super::super::c::z;"], "b": [""], "c": [""], "c::z": [""]}
    inline = {"a": ["mod inner {\n    fn g() { super::f() }\n}\nfn f() {}"], "b": [""], "c": [""]}
    assert check("t", inline, rooms) == [], check("t", inline, rooms)
    assert any("a::x uses a super:: path" in p for p in check("t", sneaky, rooms)), check("t", sneaky, rooms)
    tested = {"a": ["fn f() {}\n#[cfg(test)]\nmod tests { use super::*; }"], "b": [""], "c": [""]}
    assert check("t", tested, rooms) == [], check("t", tested, rooms)
    print("layers.py self-test: an upward import, a cycle, a module without a room, the same in directories, "
          "and a super:: path are caught")


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
