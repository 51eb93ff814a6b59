#!/usr/bin/env python3
"""Every simulator scenario under two builds, and the table rows that differ.

    scripts/sim_diff.py OLD_BIN NEW_BIN [OUT]        # runs both, then compares
    scripts/sim_diff.py --compare OLD_DIR NEW_DIR    # compares saved runs

Each build runs `iopace sim` on every scenarios/sim/*.toml and saves one
table file per scenario in OUT/old and OUT/new (default bench-out/sim-diff).
The simulator is deterministic, so any row that differs is the change's
doing. A row is flagged `!!` when its bandwidth moves by more than 2%, the
tolerance the request-path issue set for the simulator's outputs.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = os.path.join(ROOT, "scenarios", "sim")
TOLERANCE = 0.02


def run_all(binary, out):
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(SCENARIOS)):
        if not name.endswith(".toml"):
            continue
        with open(os.path.join(out, name[:-5] + ".txt"), "w") as f:
            subprocess.run([binary, "sim", os.path.join(SCENARIOS, name)], stdout=f, check=True)


def rows(path):
    """(title, section, QD) -> cells of each sweep table row."""
    out, title, section = {}, "", ""
    with open(path) as f:
        for line in f:
            if line.startswith("### "):
                title = line[4:].strip()
            elif line.startswith("**"):
                section = line.strip("*\n ")
            elif line.startswith("| ") and not line.startswith(("| QD", "|---")):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                out[(title, section, cells[0])] = cells
    return out


def moved(a, b):
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return abs(x - y) > TOLERANCE * max(abs(x), 1e-9)


def compare(old, new):
    differ = total = 0
    for name in sorted(os.listdir(old)):
        if not name.endswith(".txt"):
            continue
        ra, rb = rows(os.path.join(old, name)), rows(os.path.join(new, name))
        for key, a in ra.items():
            total += 1
            b = rb.get(key)
            if b is None:
                print(f"!!{name} {key[1]} QD{key[2]}: missing in {new}")
            elif a != b:
                differ += 1
                flag = "!!" if moved(a[1], b[1]) else ""
                bufs = f"; bufs {a[6]} -> {b[6]}" if len(a) > 6 and len(b) > 6 else ""
                print(f"{flag}{name} {key[1]} QD{key[2]}: BW {a[1]} -> {b[1]}{bufs}; p99 {a[4]} -> {b[4]}")
    print(f"{differ} of {total} rows differ")


def main(args):
    if len(args) == 3 and args[0] == "--compare":
        compare(args[1], args[2])
    elif len(args) in (2, 3):
        out = args[2] if len(args) == 3 else os.path.join(ROOT, "bench-out", "sim-diff")
        for label, binary in (("old", args[0]), ("new", args[1])):
            run_all(binary, os.path.join(out, label))
        compare(os.path.join(out, "old"), os.path.join(out, "new"))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
