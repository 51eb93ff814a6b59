#!/usr/bin/env python3
"""Tables from run.sh's output: python3 summarize.py OUT [--jsonl FILE]

Per run: fio per job (IOPS, MiB/s, p50/p99 total latency in ms), the server's
averages over the measured interval (from stats0/stats1, as
../device-time-2026-11-26/real/summarize.py: pacer MiB in flight, buffers in
use), and from poll.jsonl (get_stats every ~0.25 s after the ramp): the share
of polls with held_devices = 1, and the mean depth in effect and queue.
Then mean (min-max) per configuration over the reps.
"""
import json, os, re, statistics, sys


def interval_avg(s0, s1, get):
    a = 0.0
    for r0, r1 in zip(s0["reactors"], s1["reactors"]):
        t0, t1 = r0["uptime_s"], r1["uptime_s"]
        a += (get(r1) * t1 - get(r0) * t0) / (t1 - t0)
    return a


def load(d):
    t = open(os.path.join(d, "fio.json")).read()
    fio = json.loads(t[t.index("{"):])
    s0 = json.load(open(os.path.join(d, "stats0.json")))
    s1 = json.load(open(os.path.join(d, "stats1.json")))
    polls = [json.loads(l) for l in open(os.path.join(d, "poll.jsonl")) if l.strip()]
    jobs = {}
    for j in fio["jobs"]:
        r = j["read"]
        p = r["lat_ns"]["percentile"]
        jobs[j["jobname"]] = {"iops": r["iops"], "mibs": r["bw_bytes"] / 2**20,
                              "p50_ms": p["50.000000"] / 1e6, "p99_ms": p["99.000000"] / 1e6,
                              "errors": j["error"]}
    m = lambda k: statistics.mean(x[k] for x in polls)
    srv = {
        "pacer_mib": interval_avg(s0, s1, lambda r: r["pacer"]["bytes_in_flight_avg"]) / 2**20,
        "buffers": interval_avg(s0, s1, lambda r: r["buffers"]["in_use_avg"]),
        "polls": len(polls),
        "held": m("held_devices"),
        "depth_in_effect": m("depth_in_effect"),
        "queued": m("queued"),
        "poll_mib_in_flight": m("bytes_in_flight") / 2**20,
    }
    return {"jobs": jobs, "server": srv}


def main():
    out = sys.argv[1]
    runs = {}
    for name in sorted(os.listdir(out)):
        mm = re.match(r"r(\d+)-mix-(.*)$", name)
        if mm and os.path.exists(os.path.join(out, name, "stats1.json")):
            runs[name] = load(os.path.join(out, name)) | {"rep": int(mm[1]), "config": mm[2]}
    if "--jsonl" in sys.argv:
        with open(sys.argv[sys.argv.index("--jsonl") + 1], "w") as f:
            for name, r in runs.items():
                f.write(json.dumps({"run": name} | r, sort_keys=True) + "\n")
    print("# every run")
    for name, r in sorted(runs.items(), key=lambda kv: (kv[1]["config"], kv[1]["rep"])):
        c = [f"{j}: {r['jobs'][j]['iops']:6.0f} IOPS {r['jobs'][j]['mibs']:5.0f} MiB/s p50 {r['jobs'][j]['p50_ms']:.2f} p99 {r['jobs'][j]['p99_ms']:.2f} ms"
             for j in ("small", "large")]
        s = r["server"]
        c.append(f"held {s['held']:.2f} of {s['polls']} polls, depth {s['depth_in_effect']:.2f}, queued {s['queued']:.1f}, pacer {s['pacer_mib']:.2f} MiB, buf {s['buffers']:.1f}")
        print(f"{name:16s} " + " | ".join(c))
    order = ["devtime", "before", "after", "none"]
    label = {"devtime": "auto, devtime (bbc2f0c)", "before": "auto, before (flowsamples 7ac4dda)",
             "after": "auto, after (lonerun b912e56)", "none": "none (reference)"}
    fmt = lambda xs, f: f"{f(statistics.mean(xs))} ({f(min(xs))}-{f(max(xs))})"
    i0 = lambda x: f"{x:.0f}"
    f2 = lambda x: f"{x:.2f}"
    print("\n# mean (min-max) over the reps\n")
    print("| config | n | job | IOPS | MiB/s | p50 ms | p99 ms | polls held | depth in effect | pacer MiB in flight |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cfg in order:
        rs = [r for r in runs.values() if r["config"] == cfg]
        if not rs:
            continue
        for job in ("small", "large"):
            J = [r["jobs"][job] for r in rs]
            S = [r["server"] for r in rs]
            srv = (f"{fmt([s['held'] * 100 for s in S], i0)}% | {fmt([s['depth_in_effect'] for s in S], f2)} | "
                   f"{fmt([s['pacer_mib'] for s in S], f2)}") if job == "small" else " | | "
            print(f"| {label[cfg]} | {len(rs)} | {'4 KiB QD 32' if job == 'small' else '128 KiB QD 8'} | "
                  f"{fmt([j['iops'] for j in J], i0)} | {fmt([j['mibs'] for j in J], i0)} | "
                  f"{fmt([j['p50_ms'] for j in J], f2)} | {fmt([j['p99_ms'] for j in J], f2)} | {srv} |")
    print("\n# per rep: total MiB/s (4 KiB + 128 KiB) and held share\n")
    print("| rep | " + " | ".join(order) + " |")
    print("|---|" + "---|" * len(order))
    for n in sorted({r["rep"] for r in runs.values()}):
        cells = []
        for cfg in order:
            r = runs.get(f"r{n}-mix-{cfg}")
            if r:
                tot = sum(j["mibs"] for j in r["jobs"].values())
                cells.append(f"{tot:.0f} MiB/s, held {r['server']['held'] * 100:.0f}%")
            else:
                cells.append("")
        print(f"| {n} | " + " | ".join(cells) + " |")


main()
