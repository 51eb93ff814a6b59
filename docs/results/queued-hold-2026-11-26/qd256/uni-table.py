#!/usr/bin/env python3
"""128 KiB QD 32 alone over all reps (runs.jsonl: reps 1-3, runs-uni.jsonl:
reps 4-9): per rep MiB/s, p99 ms and pacer MiB in flight for before, after,
ref and none; then mean (min-max) and the after/before pairs.
    python3 uni-table.py runs.jsonl runs-uni.jsonl"""
import json, statistics as st, sys
runs = {}
for f in sys.argv[1:]:
    for l in open(f):
        r = json.loads(l); runs[r["run"]] = r
builds = ("before", "after", "ref", "none")
cols = {}
print("| rep | " + " | ".join(f"{b}: MiB/s, p99 ms, MiB in flight" for b in builds) + " | after/before MiB/s |")
print("|---|" + "---|" * (len(builds) + 1))
for n in sorted({r["rep"] for r in runs.values()}):
    cells = []
    for b in builds:
        ks = [k for k in runs if k.startswith(f"r{n}-uni-{b}")]
        if not ks:
            cells.append("-"); continue
        r = runs[ks[0]]; j = r["jobs"]["uni"]
        v = (j["mibs"], j["p50_ms"], j["p99_ms"], r["server"]["pacer_mib"])
        cols.setdefault(b, {})[n] = v
        cells.append(f"{v[0]:.0f}, {v[2]:.2f}, {v[3]:.2f}")
    ratio = cols["after"][n][0] / cols["before"][n][0]
    print(f"| {n} | " + " | ".join(cells) + f" | {ratio:.3f} |")
print("\n| build | runs | MiB/s | p50 ms | p99 ms | pacer MiB in flight |")
print("|---|---|---|---|---|---|")
for b in builds:
    v = list(cols[b].values())
    mm = lambda i, f: f.format(st.mean(x[i] for x in v)) + " (" + f.format(min(x[i] for x in v)) + "-" + f.format(max(x[i] for x in v)) + ")"
    print(f"| {b} | {len(v)} | {mm(0, '{:.0f}')} | {mm(1, '{:.2f}')} | {mm(2, '{:.2f}')} | {mm(3, '{:.2f}')} |")
B, A = cols["before"], cols["after"]
print(f"\nafter > before: MiB/s in {sum(A[n][0] > B[n][0] for n in B)}/{len(B)}, "
      f"p99 lower in {sum(A[n][2] < B[n][2] for n in B)}/{len(B)}, "
      f"more in flight in {sum(A[n][3] > B[n][3] for n in B)}/{len(B)}")
R = cols["ref"]
print(f"ref > before (same rep): MiB/s in {sum(R[n][0] > B[n][0] for n in R)}/{len(R)}; "
      f"ref/before {st.mean(R[n][0] / B[n][0] for n in R):.3f} mean")
