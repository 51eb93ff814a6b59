#!/usr/bin/env python3
"""The pacer's state at each run's two get_stats snapshots (end of ramp, 1 s
before the end): learned depth, depth in effect, the reactor's window
(MiB, before the depth factor), its min latency (us) and IOs queued in the
pacer. Then per configuration: the range over its runs.
    python3 state.py raw/run raw/uni"""
import json, os, re, sys
rows = {}
for out in sys.argv[1:]:
    for name in sorted(os.listdir(out)):
        m = re.match(r"r(\d+)-(.*)$", name)
        if not m or not os.path.exists(os.path.join(out, name, "stats1.json")):
            continue
        snaps = []
        for f in ("stats0.json", "stats1.json"):
            p = json.load(open(os.path.join(out, name, f)))["reactors"][0]["pacer"]
            snaps.append((p["depth"], p["depth_in_effect"], p["window_bytes"] / 2**20, p["min_latency_us"], p["queued"]))
        rows.setdefault(m[2], []).append((int(m[1]), snaps))
print("| config | rep | depth (ramp end / end) | in effect | window MiB | min latency us | queued |")
print("|---|---|---|---|---|---|---|")
for c in sorted(rows):
    for n, s in sorted(rows[c]):
        a, b = s
        print(f"| {c} | {n} | {a[0]:g} / {b[0]:g} | {a[1]:g} / {b[1]:g} | {a[2]:.2f} / {b[2]:.2f} | {a[3]:.0f} / {b[3]:.0f} | {a[4]} / {b[4]} |")
print("\n| config | runs | depth | depth in effect | window MiB | min latency us | queued |")
print("|---|---|---|---|---|---|---|")
for c in sorted(rows):
    v = [x for _, s in rows[c] for x in s]
    r = lambda i, f: f.format(min(x[i] for x in v)) + "-" + f.format(max(x[i] for x in v))
    print(f"| {c} | {len(rows[c])} | {r(0, '{:g}')} | {r(1, '{:g}')} | {r(2, '{:.2f}')} | {r(3, '{:.0f}')} | {r(4, '{}')} |")
