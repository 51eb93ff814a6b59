#!/usr/bin/env python3
"""Tables from run.sh's output: python3 summarize.py OUT [--jsonl FILE]

Per run and fio job: IOPS, MiB/s, p50/p99 total latency (fio, ms).
Per run, the server's averages over the measured interval (get_stats at
the end of the ramp and 1 s before fio ends; the counters are time
averages since start, so the interval's average is the difference of
their areas): buffers in use (count and MiB) and the pacer's bytes in
flight (MiB). Then means (and min-max) per configuration over the reps.
"""
import json
import os
import re
import statistics
import sys


def interval_avg(s0, s1, get):
    a = b = 0.0
    for r0, r1 in zip(s0["reactors"], s1["reactors"]):
        t0, t1 = r0["uptime_s"], r1["uptime_s"]
        a += (get(r1) * t1 - get(r0) * t0) / (t1 - t0)
    return a


def load(d):
    text = open(os.path.join(d, "fio.json")).read()
    fio = json.loads(text[text.index("{"):])
    s0 = json.load(open(os.path.join(d, "stats0.json")))
    s1 = json.load(open(os.path.join(d, "stats1.json")))
    jobs = {}
    for j in fio["jobs"]:
        r = j["read"]
        pct = r["lat_ns"]["percentile"]
        jobs[j["jobname"]] = {
            "iops": r["iops"],
            "mibs": r["bw_bytes"] / 2**20,
            "p50_ms": pct["50.000000"] / 1e6,
            "p99_ms": pct["99.000000"] / 1e6,
            "errors": j["error"],
        }
    srv = {
        "buffers": interval_avg(s0, s1, lambda r: r["buffers"]["in_use_avg"]),
        "buffers_mib": interval_avg(s0, s1, lambda r: r["buffers"]["in_use_avg_mib"]),
        "pacer_mib": interval_avg(s0, s1, lambda r: r["pacer"]["bytes_in_flight_avg"]) / 2**20,
        "window_mib_end": sum(r["pacer"]["window_bytes"] for r in s1["reactors"]) / 2**20,
        "buffer_waits": sum(r["buffers"]["waits"] for r in s1["reactors"]),
    }
    return {"jobs": jobs, "server": srv}


def main():
    out = sys.argv[1]
    runs = {}
    for name in sorted(os.listdir(out)):
        m = re.match(r"r(\d+)-(.*)$", name)
        if not m or not os.path.exists(os.path.join(out, name, "stats1.json")):
            continue
        runs[name] = load(os.path.join(out, name)) | {"rep": int(m[1]), "config": m[2]}
    if "--jsonl" in sys.argv:
        with open(sys.argv[sys.argv.index("--jsonl") + 1], "w") as f:
            for name, r in runs.items():
                f.write(json.dumps({"run": name} | r, sort_keys=True) + "\n")

    def row(name, r):
        cells = []
        for job in ("small", "large", "uni"):
            j = r["jobs"].get(job)
            if j:
                cells.append(f"{job}: {j['iops']:8.0f} IOPS {j['mibs']:6.1f} MiB/s p50 {j['p50_ms']:6.2f} p99 {j['p99_ms']:6.2f} ms")
        s = r["server"]
        cells.append(f"buf {s['buffers']:5.1f} ({s['buffers_mib']:5.2f} MiB) pacer {s['pacer_mib']:5.2f} MiB")
        print(f"{name:24s} " + " | ".join(cells))

    print("# every run")
    for name, r in sorted(runs.items(), key=lambda kv: (kv[1]["config"], kv[1]["rep"])):
        row(name, r)

    print("\n# mean over reps (min-max)")
    configs = sorted({r["config"] for r in runs.values()})
    for c in configs:
        rs = [r for r in runs.values() if r["config"] == c]
        cells = []
        for job in ("small", "large", "uni"):
            if job not in rs[0]["jobs"]:
                continue
            parts = []
            for k, fmt in (("iops", "{:.0f}"), ("mibs", "{:.1f}"), ("p50_ms", "{:.2f}"), ("p99_ms", "{:.2f}")):
                v = [r["jobs"][job][k] for r in rs]
                parts.append(f"{k} " + fmt.format(statistics.mean(v)) + " (" + fmt.format(min(v)) + "-" + fmt.format(max(v)) + ")")
            cells.append(f"{job}: " + ", ".join(parts))
        for k in ("buffers", "buffers_mib", "pacer_mib"):
            v = [r["server"][k] for r in rs]
            cells.append(f"{k} {statistics.mean(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"{c} (n={len(rs)}): " + "; ".join(cells))

    if "--md" in sys.argv:
        markdown(runs, configs)


def markdown(runs, configs):
    """Means (min-max over reps) per configuration and job, then the
    after/before ratio of each rep's pair."""
    def mm(v, fmt):
        return fmt.format(statistics.mean(v)) + " (" + fmt.format(min(v)) + "-" + fmt.format(max(v)) + ")"

    print("\n| config | n | job | IOPS | MiB/s | p50 ms | p99 ms | buffers in use | MiB in buffers | pacer MiB in flight |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        rs = [r for r in runs.values() if r["config"] == c]
        for job in ("small", "large", "uni"):
            if job not in rs[0]["jobs"]:
                continue
            v = lambda k: [r["jobs"][job][k] for r in rs]
            srv = lambda k: [r["server"][k] for r in rs]
            print(f"| {c} | {len(rs)} | {job} | {mm(v('iops'), '{:.0f}')} | {mm(v('mibs'), '{:.0f}')} | "
                  f"{mm(v('p50_ms'), '{:.2f}')} | {mm(v('p99_ms'), '{:.2f}')} | {mm(srv('buffers'), '{:.1f}')} | "
                  f"{mm(srv('buffers_mib'), '{:.2f}')} | {mm(srv('pacer_mib'), '{:.2f}')} |")

    print("\n| pair | rep | job | MiB/s before | MiB/s after | after/before | p50 before | p50 after |")
    print("|---|---|---|---|---|---|---|---|")
    for base in ("mix-probe", "mix-default", "uni"):
        for rep in sorted({r["rep"] for r in runs.values()}):
            b = runs.get(f"r{rep}-{base}-before")
            a = runs.get(f"r{rep}-{base}-after")
            if not (a and b):
                continue
            for job in ("small", "large", "uni"):
                if job in b["jobs"]:
                    jb, ja = b["jobs"][job], a["jobs"][job]
                    print(f"| {base} | {rep} | {job} | {jb['mibs']:.0f} | {ja['mibs']:.0f} | "
                          f"{ja['mibs'] / jb['mibs']:.3f} | {jb['p50_ms']:.2f} | {ja['p50_ms']:.2f} |")

    # What the machine's load moves less: how the two jobs of one run split
    # the disk, and what the server held in flight.
    print("\n| pair | rep | total MiB/s before / after | 128 KiB share of bytes before / after | 128 KiB : 4 KiB IOPS before / after | pacer MiB in flight before / after | buffers in use before / after |")
    print("|---|---|---|---|---|---|---|")
    wins = {}
    for base in ("mix-probe", "mix-default"):
        for rep in sorted({r["rep"] for r in runs.values()}):
            b = runs.get(f"r{rep}-{base}-before")
            a = runs.get(f"r{rep}-{base}-after")
            if not (a and b):
                continue
            cells = []
            for key, f in (("total", lambda r: r["jobs"]["small"]["mibs"] + r["jobs"]["large"]["mibs"]),
                           ("share", lambda r: r["jobs"]["large"]["mibs"] / (r["jobs"]["small"]["mibs"] + r["jobs"]["large"]["mibs"])),
                           ("ratio", lambda r: r["jobs"]["large"]["iops"] / r["jobs"]["small"]["iops"]),
                           ("pacer", lambda r: r["server"]["pacer_mib"]),
                           ("buffers", lambda r: r["server"]["buffers"])):
                vb, va = f(b), f(a)
                wins.setdefault(key, [0, 0])[0] += va > vb
                wins[key][1] += 1
                fmt = {"total": "{:.0f}", "share": "{:.3f}", "ratio": "{:.4f}", "pacer": "{:.3f}", "buffers": "{:.1f}"}[key]
                cells.append(fmt.format(vb) + " / " + fmt.format(va))
            print(f"| {base} | {rep} | " + " | ".join(cells) + " |")
    print("\npairs where after > before: " + ", ".join(f"{k} {w}/{n}" for k, (w, n) in wins.items()))


main()
