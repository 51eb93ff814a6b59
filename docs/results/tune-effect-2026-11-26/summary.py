#!/usr/bin/env python3
"""Per repetition, from each bench run's fio JSON and run record: the
saturating tenant's IOPS, the QD 1 probe's IOPS and p99, the server's CPU
per IO and (where the bench sampled it) the vrate it held.
Usage: summary.py BENCH_OUT_DIR [TARGET_P99_US]"""
import glob, json, os, re, sys

def jobs(path):
    text = open(path).read()
    d = json.loads(text[text.index("\n{") + 1:])
    out = {}
    for j in d["client_stats"]:
        if j["jobname"] == "All clients":
            continue
        name = j["jobname"].split(".")[1]
        r = j["read"]
        out[name] = (r["iops"], r["clat_ns"]["percentile"]["99.000000"] / 1e3)
    return out

def stats(bench, key):
    try:
        return json.load(open(os.path.join(bench, "runs", key + ".json")))["stats"]
    except OSError:
        return {}

rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/logs/*-fio.json")):
    m = re.search(r"/([\w-]+-p\d+-(\w+)-r(\d+))-fio", f)
    rows.setdefault(m.group(2), []).append((int(m.group(3)), jobs(f), stats(sys.argv[1], m.group(1))))
target = float(sys.argv[2]) if len(sys.argv) > 2 else None
tot = {}
print("| target | rep | tenant IOPS | probe IOPS | probe p99 us | server CPU us/IO | vrate % |")
print("|---|---|---|---|---|---|---|")
for t, reps in rows.items():
    for r, j, s in sorted(reps, key=lambda x: x[0]):
        ten = j.get("tenant", (0.0, 0.0))[0]
        v = s.get("pacer_vrate")
        vr = f"{100 * v:.0f}" if v is not None else "-"
        print(f"| {t} | {r + 1} | {ten:,.0f} | {j['probe'][0]:,.0f} | {j['probe'][1]:,.0f} | {s.get('cpu_us_per_io', 0):.1f} | {vr} |")
    tot[t] = sum(j.get("tenant", (0.0, 0.0))[0] for _, j, _ in reps)
    p99s = [j["probe"][1] for _, j, _ in reps]
    print(f"| {t} | all | {tot[t]:,.0f} | | {min(p99s):,.0f}-{max(p99s):,.0f} | | |")
if "untuned" in tot and "tuned" in tot:
    print(f"\ntuned / untuned tenant IOPS: {tot['tuned'] / tot['untuned']:.1%}")
if target:
    print(f"probe p99 target: {target:,.0f} us")
