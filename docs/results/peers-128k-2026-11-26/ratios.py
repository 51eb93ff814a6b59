#!/usr/bin/env python3
"""Per-repetition ratios from bench/peers.py's results.json: iopace / best peer.

usage: ratios.py results.json
Runs of one (server, transport, job) are in repetition order, so run i of
every server is repetition i; the best peer is the faster of nbdkit and
qemu-nbd in that same repetition.
"""
import json
import statistics
import sys

res = json.load(open(sys.argv[1]))
by = {(r["transport"], r["job"], r["server"]): r["runs"] for r in res}
PEERS = ("nbdkit-memory", "qemu-nbd-null")
IOPACE = ("iopace-malloc", "iopace-null")
for transport, job in sorted({(t, j) for t, j, _ in by}, key=lambda k: (k[0] != "unix", k[1])):
    runs = {s: by.get((transport, job, s), []) for s in IOPACE + PEERS}
    n = min(len(v) for v in runs.values())
    print(f"## {transport} {job}, {n} repetitions\n")
    print("| rep | " + " | ".join(f"{s} MiB/s" for s in IOPACE + PEERS)
          + " | best peer | malloc / best | null / best |")
    print("|---" * (len(IOPACE + PEERS) + 4) + "|")
    ratios = {s: [] for s in IOPACE}
    for i in range(n):
        best = max(PEERS, key=lambda s: runs[s][i]["mibs"])
        row = [f"{runs[s][i]['mibs']:.0f}" for s in IOPACE + PEERS]
        for s in IOPACE:
            ratios[s].append(runs[s][i]["mibs"] / runs[best][i]["mibs"])
        print(f"| {i + 1} | " + " | ".join(row) + f" | {best} | "
              + " | ".join(f"{ratios[s][i]:.3f}" for s in IOPACE) + " |")
    print()
    for s in IOPACE:
        r = ratios[s]
        print(f"{s} / best peer: median {statistics.median(r):.3f}, min {min(r):.3f}, max {max(r):.3f}, "
              f"reps >= 1.2: {sum(x >= 1.2 for x in r)} of {n}")
    med_best = {s: statistics.median(x["mibs"] for x in runs[s]) for s in runs}
    bp = max(PEERS, key=lambda s: med_best[s])
    print(f"ratio of medians: malloc {med_best['iopace-malloc'] / med_best[bp]:.3f}, "
          f"null {med_best['iopace-null'] / med_best[bp]:.3f} (best peer by median: {bp})")
    print()
    print("| server | MiB/s | server CPU/IO, us | server CPU, % of a core | fio CPU, % of a core | machine busy, % of 2 cores |")
    print("|---|---|---|---|---|---|")
    for s in IOPACE + PEERS:
        def cell(key, fmt):
            vals = [x[key] for x in runs[s] if key in x]
            if not vals:
                return "-"
            return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"
        print(f"| {s} | {cell('mibs', '{:.0f}')} | {cell('cpu_us_per_io', '{:.1f}')} | "
              f"{cell('server_cpu_pct', '{:.0f}')} | {cell('fio_cpu_pct', '{:.0f}')} | {cell('machine_busy_pct', '{:.0f}')} |")
    print()
