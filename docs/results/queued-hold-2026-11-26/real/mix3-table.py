#!/usr/bin/env python3
"""mix3.txt (copied from ../../lone-run-2026-11-26, builds ref/before/after, no poll column) -> per reader and build: writer MiB/s, reader IOPS, p99 (each run, then mean)."""
import re, statistics, sys
rows = {}
for fn in sys.argv[1:]:
    for l in open(fn):
        m = re.match(r"r(\d+) (\w+) auto reader=(\w+) w (\d+) MiB/s; r (\d+) IOPS p50 (\d+) p99 (\d+) us(.*)", l)
        if m:
            n, b, rd, w, io, p50, p99, rest = m.groups()
            h = re.search(r"held 0/1/2 devices in (\d+)/(\d+)/(\d+)%", rest)
            rows.setdefault((rd, b), []).append((int(n), int(w), int(io), int(p50), int(p99), h.group(3) + "%" if h else "-"))
print("| reader | build | writer MiB/s (by rep) | mean | reader IOPS mean | reader p50 us mean | reader p99 us (by rep) | p99 mean / median |")
print("|---|---|---|---|---|---|---|---|")
for rd in ("ram", "disk"):
    for b in ("ref", "before", "after"):
        r = sorted(rows[(rd, b)])
        w = [x[1] for x in r]; p99 = [x[4] for x in r]
        print(f"| {rd} | {b} | {' / '.join(map(str, w))} | {statistics.mean(w):.0f} | {statistics.mean(x[2] for x in r):.0f} | "
              f"{statistics.mean(x[3] for x in r):.0f} | {' / '.join(map(str, p99))} | {statistics.mean(p99):.0f} / {statistics.median(p99):.0f} |")
# pairs before vs after
print("\nPairs (same rep), after vs before:")
for rd in ("ram", "disk"):
    B = {x[0]: x for x in rows[(rd, "before")]}; A = {x[0]: x for x in rows[(rd, "after")]}
    wbetter = sum(A[n][1] >= B[n][1] for n in B); pbetter = sum(A[n][4] <= B[n][4] for n in B)
    print(f"  {rd}: writer MiB/s after >= before in {wbetter}/{len(B)}; reader p99 after <= before in {pbetter}/{len(B)}")
