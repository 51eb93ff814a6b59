#!/usr/bin/env python3
"""Per-repetition ratios from bench/peers.py's results.json for this folder's
runs: each iopace build/setting over the faster peer of the same repetition,
and over main's binary of the same repetition.

usage: ratios.py results.json
"""
import json
import statistics
import sys

res = json.load(open(sys.argv[1]))
by = {(r["transport"], r["job"], r["server"]): r["runs"] for r in res}
PEERS = [s for s in ("nbdkit-memory", "qemu-nbd-null") if any(k[2] == s for k in by)]
IOPACE = sorted({k[2] for k in by if k[2].startswith("iopace")}, key=lambda s: ("+main" not in s, s))
MAIN = next((s for s in IOPACE if "+main" in s), None)
for transport, job in sorted({(t, j) for t, j, _ in by}, key=lambda k: (k[0] != "unix", k[1])):
    runs = {s: by.get((transport, job, s), []) for s in IOPACE + PEERS}
    n = min(len(v) for v in runs.values())
    print(f"## {transport} {job}, {n} repetitions\n")
    print("| rep | " + " | ".join(f"{s}" for s in IOPACE + PEERS) + " | best peer |")
    print("|---" * (len(IOPACE + PEERS) + 2) + "|")
    ratios = {s: [] for s in IOPACE}
    over_main = {s: [] for s in IOPACE}
    for i in range(n):
        best = max(PEERS, key=lambda s: runs[s][i]["mibs"]) if PEERS else None
        for s in IOPACE:
            if best:
                ratios[s].append(runs[s][i]["mibs"] / runs[best][i]["mibs"])
            if MAIN:
                over_main[s].append(runs[s][i]["mibs"] / runs[MAIN][i]["mibs"])
        row = [f"{runs[s][i]['mibs']:.0f}" for s in IOPACE + PEERS]
        print(f"| {i + 1} | " + " | ".join(row) + f" | {best} |")
    print()
    print("| server | / best peer: median (min-max) | reps >= 1.2 | / main: median (min-max) |")
    print("|---|---|---|---|")
    for s in IOPACE:
        r, m = ratios[s], over_main[s]
        rp = f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})" if r else "-"
        mm = f"{statistics.median(m):.3f} ({min(m):.3f}-{max(m):.3f})" if m else "-"
        print(f"| {s} | {rp} | {sum(x >= 1.2 for x in r)} of {n} | {mm} |")
    print()
    print("| server | MiB/s | IOPS | p99, us | server CPU/IO, us | server CPU, % of a core | fio CPU, % of a core | machine busy, % of 2 cores |")
    print("|---|---|---|---|---|---|---|---|")
    for s in IOPACE + PEERS:
        def cell(key, fmt):
            vals = [x[key] for x in runs[s] if key in x]
            if not vals:
                return "-"
            return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"
        print(f"| {s} | {cell('mibs', '{:.0f}')} | {cell('iops', '{:.0f}')} | {cell('p99_us', '{:.0f}')} | "
              f"{cell('cpu_us_per_io', '{:.1f}')} | {cell('server_cpu_pct', '{:.0f}')} | "
              f"{cell('fio_cpu_pct', '{:.0f}')} | {cell('machine_busy_pct', '{:.0f}')} |")
    print()
