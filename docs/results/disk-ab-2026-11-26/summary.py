#!/usr/bin/env python3
"""Tables from ab.sh's output: python3 summary.py OUT [A B] [--jsonl FILE]

Per run (name r<rep>-<case>-<arm>): per fio job MiB/s, p50 and p99 total
latency (ms; the read or write side, whichever the job did); the server's
averages over the measured interval (between get_stats at the end of the
ramp and 1 s before the end, as ../queued-hold-2026-11-26/real/summarize.py
computes them): buffers in use and the pacer's MiB in flight; and the
pacer's state at the last snapshot (learned depth, window MiB, min latency
us). Then per case and arm the mean (min-max), and the B/A pairs: each
rep's ratio of total MiB/s and how many pairs B won. A, B: arm labels
(default ref, now)."""
import json, os, re, statistics as st, sys


def interval_avg(s0, s1, get):
    a = 0.0
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
        side = "write" if j["write"]["io_bytes"] > j["read"]["io_bytes"] else "read"
        r = j[side]
        pct = r["lat_ns"]["percentile"]
        jobs[j["jobname"]] = {"side": side, "iops": r["iops"], "mibs": r["bw_bytes"] / 2**20,
                              "p50_ms": pct["50.000000"] / 1e6, "p99_ms": pct["99.000000"] / 1e6,
                              "errors": j["error"]}
    p = s1["reactors"][0]["pacer"]
    srv = {
        "buffers": interval_avg(s0, s1, lambda r: r["buffers"]["in_use_avg"]),
        "buffers_mib": interval_avg(s0, s1, lambda r: r["buffers"]["in_use_avg_mib"]),
        "pacer_mib": interval_avg(s0, s1, lambda r: r["pacer"]["bytes_in_flight_avg"]) / 2**20,
        "depth_end": p.get("depth"), "window_mib_end": p["window_bytes"] / 2**20,
        "min_lat_us_end": p.get("min_latency_us"), "queued_end": p.get("queued"),
    }
    return {"jobs": jobs, "server": srv, "version": open(os.path.join(d, "version.txt")).read().strip(),
            "start": open(os.path.join(d, "start.txt")).read().strip()}


def total(r):
    return sum(j["mibs"] for j in r["jobs"].values())


def main():
    args = [a for a in sys.argv[1:]]
    jsonl = None
    if "--jsonl" in args:
        i = args.index("--jsonl"); jsonl = args[i + 1]; del args[i:i + 2]
    out = args[0]
    A, B = (args[1], args[2]) if len(args) >= 3 else ("ref", "now")
    runs = {}
    for name in sorted(os.listdir(out)):
        m = re.match(r"r(\d+)-(rd|wr|mix)-(.*)$", name)
        if not m or not os.path.exists(os.path.join(out, name, "stats1.json")):
            continue
        runs[name] = load(os.path.join(out, name)) | {"rep": int(m[1]), "case": m[2], "arm": m[3]}
    if jsonl:
        with open(jsonl, "w") as f:
            for name, r in runs.items():
                f.write(json.dumps({"run": name} | r, sort_keys=True) + "\n")

    print("## every run\n")
    print("| run | start | version | jobs: MiB/s, p50 ms, p99 ms | total MiB/s | buffers in use | pacer MiB in flight | depth end | window MiB end | min lat us end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in sorted(runs.items(), key=lambda kv: (kv[1]["case"], kv[1]["rep"], kv[1]["arm"])):
        js = "; ".join(f"{k} {j['mibs']:.0f}, {j['p50_ms']:.2f}, {j['p99_ms']:.2f}" for k, j in r["jobs"].items())
        s = r["server"]
        d = "-" if s["depth_end"] is None else f"{s['depth_end']:g}"
        print(f"| {name} | {r['start']} | {r['version'].split('commit ')[-1].rstrip(')')[:7]} | {js} | {total(r):.0f} | "
              f"{s['buffers']:.1f} | {s['pacer_mib']:.2f} | {d} | {s['window_mib_end']:.2f} | {s['min_lat_us_end']} |")

    mm = lambda v, f: f.format(st.mean(v)) + " (" + f.format(min(v)) + "-" + f.format(max(v)) + ")"
    print("\n## mean (min-max) per case and arm\n")
    print("| case | arm | n | job | MiB/s | p50 ms | p99 ms | total MiB/s | buffers in use | pacer MiB in flight |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in ("rd", "wr", "mix"):
        arms = sorted({r["arm"] for r in runs.values() if r["case"] == case}, key=lambda a: (a != A, a != B, a))
        for arm in arms:
            rs = [r for r in runs.values() if r["case"] == case and r["arm"] == arm]
            for job in rs[0]["jobs"]:
                v = lambda k: [r["jobs"][job][k] for r in rs]
                print(f"| {case} | {arm} | {len(rs)} | {job} | {mm(v('mibs'), '{:.0f}')} | {mm(v('p50_ms'), '{:.2f}')} | "
                      f"{mm(v('p99_ms'), '{:.2f}')} | {mm([total(r) for r in rs], '{:.0f}')} | "
                      f"{mm([r['server']['buffers'] for r in rs], '{:.1f}')} | {mm([r['server']['pacer_mib'] for r in rs], '{:.2f}')} |")

    print(f"\n## pairs: {B}/{A} per rep (total MiB/s; p99 of the 128 KiB job)\n")
    print(f"| case | rep | first | {A} MiB/s | {B} MiB/s | {B}/{A} | {A} p99 | {B} p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for case in ("rd", "wr", "mix"):
        ratios = []; wins = 0; p99w = 0
        for n in sorted({r["rep"] for r in runs.values()}):
            a, b = runs.get(f"r{n}-{case}-{A}"), runs.get(f"r{n}-{case}-{B}")
            if not (a and b):
                continue
            big = "uni" if "uni" in a["jobs"] else "large"
            first = A if a["start"] < b["start"] else B
            ratio = total(b) / total(a); ratios.append(ratio); wins += ratio > 1
            p99w += b["jobs"][big]["p99_ms"] < a["jobs"][big]["p99_ms"]
            print(f"| {case} | {n} | {first} | {total(a):.0f} | {total(b):.0f} | {ratio:.3f} | "
                  f"{a['jobs'][big]['p99_ms']:.2f} | {b['jobs'][big]['p99_ms']:.2f} |")
        if ratios:
            print(f"| **{case}** | **{len(ratios)} pairs** | | | | **mean {st.mean(ratios):.3f} "
                  f"(geo {st.geometric_mean(ratios):.3f}), {min(ratios):.3f}-{max(ratios):.3f}; {B} ahead in {wins}/{len(ratios)}** | | "
                  f"**{B} p99 lower in {p99w}/{len(ratios)}** |")


main()
