#!/usr/bin/env python3
"""Per repetition, from each bench run's fio JSON and run record: the
saturating tenant's IOPS, the QD 1 probe's IOPS, p50 and p99, the server's
CPU per IO and the vrate it held; then per target the tenant's mean IOPS as
a share of `untuned`'s, and the probe's p99 range against TARGET_US.
(../tune-effect-2026-11-26/summary.py with p50 and every target's share.)
Usage: summary.py BENCH_OUT_DIR [TARGET_P99_US]"""
import glob, json, os, re, statistics, sys

def jobs(path):
    text = open(path).read()
    d = json.loads(text[text.index("\n{") + 1:])
    out = {}
    for j in d["client_stats"]:
        if j["jobname"] == "All clients":
            continue
        name = j["jobname"].split(".")[1]
        r = j["read"]
        p = r["clat_ns"]["percentile"]
        out[name] = (r["iops"], p["50.000000"] / 1e3, p["99.000000"] / 1e3)
    return out

def stats(bench, key):
    try:
        return json.load(open(os.path.join(bench, "runs", key + ".json")))["stats"]
    except OSError:
        return {}

rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/logs/*-fio.json")):
    m = re.search(r"/([\w-]+-p\d+-([\w-]+)-r(\d+))-fio", f)
    rows.setdefault(m.group(2), []).append((int(m.group(3)), jobs(f), stats(sys.argv[1], m.group(1))))
target = float(sys.argv[2]) if len(sys.argv) > 2 else None
print("| target | rep | tenant IOPS | probe IOPS | probe p50 us | probe p99 us | server CPU us/IO | vrate % |")
print("|---|---|---|---|---|---|---|---|")
mean = {}
p99 = {}
for t, reps in rows.items():
    for r, j, s in sorted(reps, key=lambda x: x[0]):
        ten = j.get("tenant", (0.0, 0.0, 0.0))[0]
        v = s.get("pacer_vrate")
        vr = f"{100 * v:.0f}" if v is not None else "-"
        pr = j["probe"]
        print(f"| {t} | {r + 1} | {ten:,.0f} | {pr[0]:,.0f} | {pr[1]:,.0f} | {pr[2]:,.0f} | {s.get('cpu_us_per_io', 0):.1f} | {vr} |")
    mean[t] = statistics.mean(j.get("tenant", (0.0,))[0] for _, j, _ in reps)
    p99[t] = [j["probe"][2] for _, j, _ in reps]
print()
print("| target | tenant IOPS, mean | of untuned | probe p99 us | within target |")
print("|---|---|---|---|---|")
for t in rows:
    share = f"{mean[t] / mean['untuned']:.1%}" if "untuned" in mean else "-"
    within = f"{sum(p <= target for p in p99[t])} of {len(p99[t])}" if target else "-"
    print(f"| {t} | {mean[t]:,.0f} | {share} | {min(p99[t]):,.0f}-{max(p99[t]):,.0f} | {within} |")
if target:
    print(f"\nprobe p99 target: {target:,.0f} us")
