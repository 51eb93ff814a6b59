#!/usr/bin/env python3
"""Two `bench/sim_fuzz.py` outputs for the same seed, case by case.

    python3 bench/fuzz_compare.py BEFORE.txt AFTER.txt

One line per (scenario, QD) flagged in either: `auto`'s share of the best
seed mode, its bandwidth and buffers before and after ("ok": not flagged,
i.e. at least 95% and within the buffer bound), and "busy" where every
drive in use was at least 95% busy.
"""
import re
import sys

LINE = re.compile(r"(fuzz\d+_\d+)\.toml qd (\d+): auto ([\d.]+) of best ([\d.]+) "
                  r"\((\d+)%\), bufs ([\d.]+)")


def load(path):
    cases = {}
    with open(path) as f:
        for line in f:
            m = LINE.search(line)
            if m:
                cases[(m[1], int(m[2]))] = (float(m[3]), int(m[5]), float(m[6]), "busy" in line)
    return cases


def show(case):
    if case is None:
        return "  ok"
    bw, pct, bufs, busy = case
    return f"{pct:3d}% {bw:6.1f} bufs {bufs:5.1f}{' busy' if busy else ''}"


def main():
    before, after = load(sys.argv[1]), load(sys.argv[2])
    order = lambda k: (int(k[0].split("_")[1]), k[1])
    for key in sorted(set(before) | set(after), key=order):
        print(f"{key[0]:10s} qd{key[1]:<5d} {show(before.get(key)):32s} -> {show(after.get(key))}")


if __name__ == "__main__":
    main()
