#!/usr/bin/env python3
"""Structure measures a reader would take: import circles between the files
of each crate, non-test files over 700 lines, functions over 70 lines, and
types whose inherent `impl` blocks are spread over more than two files.

An edge A -> B means file A names an item of module B (`crate::b::..`,
`super::b`, `self::b`, or a bare `b::` of a child module). Edges between a
module and its own ancestors are the module tree, not imports, and are left
out. Test code (`#[cfg(test)]` modules, `tests.rs`, `*_tests.rs`) is left out
of both measures.

    scripts/structure.py            # summary
    scripts/structure.py -v         # every circle and every long file
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
# The source-tree issue's goals: no type's `impl` in more than two files.
IMPL_FILES = 2
LIMIT = 700
FN_LIMIT = 70
FN_START = re.compile(r"^\s*(pub(\([\w:]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def long_functions(text):
    """(name, lines) of each function longer than FN_LIMIT lines, counted
    from its `fn` line to its closing brace."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = FN_START.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            code = re.sub(r"//.*", "", lines[j])
            code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
            code = re.sub(r"'(\\.|[^'\\])'", "''", code)
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                break
            if not opened and code.rstrip().endswith(";"):
                break
            j += 1
        if opened and j - i + 1 > FN_LIMIT:
            out.append((m.group(6), j - i + 1))
        i += 1 if not opened else 1
    return out


def is_test_file(path):
    base = os.path.basename(path)
    return base == "tests.rs" or base.endswith("_tests.rs") or "/tests/" in path


def strip_tests(text):
    """The text before the first `#[cfg(test)]` item that is a module."""
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text, re.M)
    return text[: m.start()] if m else text


def modules(src):
    """Map module path (tuple) -> file for one crate's src dir."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            if rel[0] == "bin":
                continue
            mods[path] = full
    return mods


def resolve(mods, here, segs):
    """The longest module prefix of `segs` (absolute) that is a file."""
    best = None
    for i in range(1, len(segs) + 1):
        if tuple(segs[:i]) in mods:
            best = tuple(segs[:i])
    return best


PATH = re.compile(r"\b((?:crate|super|self)(?:::\w+)+|(?:\w+)(?:::\w+)+)")
USE_GROUP = re.compile(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\}", re.S)


def refs(text):
    out = [m.group(1) for m in PATH.finditer(text)]
    for m in USE_GROUP.finditer(text):
        for item in re.split(r",", m.group(2)):
            item = item.strip().split(" as ")[0].strip()
            if item and re.match(r"^[\w:]+$", item) and item != "self":
                out.append(m.group(1) + "::" + item)
    return out


def absolute(here, ref, mods):
    segs = ref.split("::")
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        return base + segs
    # a bare path: a child module of `here`, or a module at crate root
    if tuple(list(here) + [segs[0]]) in mods:
        return list(here) + segs
    return None


def edges(mods):
    e = {m: set() for m in mods}
    for m, f in mods.items():
        if is_test_file(f) or (m and m[-1].endswith("tests")):
            continue
        text = strip_tests(open(f).read())
        text = re.sub(r"//.*", "", text)
        for r in refs(text):
            segs = absolute(m, r, mods)
            if segs is None:
                continue
            t = resolve(mods, m, segs)
            if t is None or t == m:
                continue
            if is_test_file(mods[t]) or (t and t[-1].endswith("tests")):
                continue
            # ancestry is the module tree, not an import
            if t == m[: len(t)] or m == t[: len(m)]:
                continue
            e[m].add(t)
    return e


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


IMPL = re.compile(r"^impl(?:<[^>]*>)?\s+([A-Z]\w*)(?:<[^{]*>)?\s*\{", re.M)


def impl_files(mods):
    """Type name -> files holding an inherent `impl` of it (non-test).
    Types of one name defined in several files (two `Conn`s) are told
    apart only as far as each file that impls one also defines it."""
    out, defines = {}, {}
    for m, f in mods.items():
        if is_test_file(f):
            continue
        text = strip_tests(open(f).read())
        for name in IMPL.findall(text):
            out.setdefault(name, set()).add(f)
            if re.search(rf"^\s*(pub(\([\w:]+\))?\s+)?(struct|enum)\s+{name}\b", text, re.M):
                defines.setdefault(name, set()).add(f)
    return {
        n: fs for n, fs in out.items() if not (len(defines.get(n, ())) > 1 and defines[n] == fs)
    }


def main():
    verbose = "-v" in sys.argv
    circles, long_files, long_fns, spread = [], [], [], []
    for crate in sorted(os.listdir(ROOT)):
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        mods = modules(src)
        for name, files in impl_files(mods).items():
            if len(files) > IMPL_FILES:
                rels = sorted(os.path.relpath(f, src) for f in files)
                spread.append(f"{crate}: {name} in {len(files)} files: " + " ".join(rels))
        for comp in sccs(edges(mods)):
            names = sorted("/".join(m) or "lib" for m in comp)
            circles.append(f"{crate}: " + " ".join(names))
        for m, f in mods.items():
            if is_test_file(f):
                continue
            text = strip_tests(open(f).read())
            rel = os.path.relpath(f, os.path.join(ROOT, ".."))
            n = text.count("\n")
            if n > LIMIT:
                long_files.append((n, rel))
            for name, k in long_functions(text):
                long_fns.append((k, f"{rel} {name}"))
    print(f"import circles: {len(circles)}")
    if verbose:
        for c in circles:
            print("  " + c)
    print(f"non-test files over {LIMIT} lines: {len(long_files)}")
    if verbose:
        for n, f in sorted(long_files, reverse=True):
            print(f"  {n:5} {f}")
    print(f"types with inherent impls in more than {IMPL_FILES} files: {len(spread)}")
    if verbose:
        for x in sorted(spread):
            print("  " + x)
    print(f"non-test functions over {FN_LIMIT} lines: {len(long_fns)}")
    if verbose:
        for n, f in sorted(long_fns, reverse=True):
            print(f"  {n:5} {f}")


if __name__ == "__main__":
    main()
