#!/usr/bin/env python3
"""Random simulator scenarios outside the library: where does `auto` fall
behind the seed's modes, or hold more than it should?

    python3 bench/sim_fuzz.py IOPACE N [SEED] [OUT_DIR]

Writes N scenarios (links of mixed speeds, 1-8 reactors, drives fast and
slow, sizes 4 KiB-1 MiB, reads, writes and mixes), runs each with `none`,
`buffers (96)` and `auto` at QD 16, 128 and 1024, and prints one line per
case where `auto` carries under 95% of the better seed mode, or holds more
than 8 MiB in flight with IO of 128 KiB or less.

A case where `auto` keeps every drive it uses at least 95% busy is listed
apart ("drives busy"): the drives bind there, and the bytes they carry
depend on which hosts' sizes they serve (FIFO at a drive favours large IO;
`auto` gives small-IO hosts more turns), not on the bottleneck being idle.
"""
import json
import os
import random
import subprocess
import sys

LINKS = [23.1, 46.2, 92.4, 184.8]
SIZES = [4096, 16384, 65536, 131072, 262144, 1048576]


def devices(rng):
    groups = []
    for _ in range(rng.choice([1, 1, 2])):
        bw = rng.choice([0.5e9, 1e9, 2.5e9, 6e9])
        iops = rng.choice([50e3, 200e3, 550e3, 1e6])
        groups.append({
            "count": rng.choice([1, 2, 4, 8, 16]),
            "kind": "nvme",
            "latency_us": rng.choice([10, 20, 80, 500, 1000]),
            "parallel": rng.choice([1, 1, 4]),
            "cost": {"rbps": bw, "rseqiops": iops, "rrandiops": iops,
                     "wbps": bw * 0.8, "wseqiops": iops * 0.9, "wrandiops": iops * 0.9},
        })
    return groups


def hosts(rng, ports, ndev):
    groups = []
    for _ in range(rng.choice([1, 2, 3])):
        sizes = rng.sample(SIZES, rng.choice([1, 1, 2, 3]))
        h = {
            "count": rng.choice([1, 2, 4]),
            "bssplit": [[s, rng.randint(1, 4)] for s in sizes],
            "read_pct": rng.choice([100, 100, 70, 0]),
            "port": rng.randrange(len(ports)),
        }
        rate = ports[h["port"]]["rate_gbps"]
        slower = [l for l in LINKS if l < rate]
        if slower and rng.random() < 0.5:
            h["link_gbps"] = rng.choice(slower)
        if rng.random() < 0.3:
            h["devices"] = sorted(rng.sample(range(ndev), rng.randint(1, min(ndev, 4))))
        groups.append(h)
    return groups


def scenario(rng, i):
    ports = [{"rate_gbps": rng.choice(LINKS), "rtt_us": rng.choice([10, 20, 50])}
             for _ in range(rng.choice([1, 2]))]
    devs = devices(rng)
    ndev = sum(d["count"] for d in devs)
    s = {
        "name": f"fuzz {i}",
        "description": "random",
        "duration_ms": 100,
        "warmup_ms": 40,
        "qds": [16, 128, 1024],
        "target": {"reactors": rng.choice([1, 2, 4, 8]), "buffer_size": 131072,
                   "num_shared_buffers": 1300, "ddio_budget_mib": 12,
                   "ddio_slope": 0.075, "ddio_floor": 0.6},
        "ports": ports,
        "devices": devs,
        "hosts": hosts(rng, ports, ndev),
        "runs": [
            {"label": "none", "pacing": {"mode": "none"}},
            {"label": "buffers", "pacing": {"mode": "buffers"}, "num_shared_buffers": 96},
            {"label": "auto", "pacing": {"mode": "auto"}},
        ],
    }
    return s


def toml(s):
    def val(v):
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)
    out = []
    for k, v in s.items():
        if not isinstance(v, (dict, list)) or k == "qds":
            out.append(f"{k} = {val(v)}")
    out.append("[target]")
    out += [f"{k} = {val(v)}" for k, v in s["target"].items()]
    for table in ["ports", "devices", "hosts", "runs"]:
        for item in s[table]:
            out.append(f"[[{table}]]")
            out += [f"{k} = {val(v)}" for k, v in item.items()]
    return "\n".join(out) + "\n"


def main(args):
    binary, n = args[0], int(args[1])
    seed = int(args[2]) if len(args) > 2 else 1
    out = args[3] if len(args) > 3 else "/tmp/sim-fuzz"
    os.makedirs(out, exist_ok=True)
    rng = random.Random(seed)
    bad = busy = 0
    for i in range(n):
        s = scenario(rng, i)
        path = os.path.join(out, f"fuzz{seed}_{i}.toml")
        with open(path, "w") as f:
            f.write(toml(s))
        r = subprocess.run([binary, "sim", "--json", path], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{path}: exit {r.returncode}: {r.stderr.strip()[:300]}")
            bad += 1
            continue
        runs = {x["run"]: x["rows"] for x in json.loads(r.stdout)}
        small = max(b for h in s["hosts"] for b, _ in h["bssplit"]) <= 131072
        for k, row in enumerate(runs["auto"]):
            best = max(runs["none"][k]["bw_gbps"], runs["buffers"][k]["bw_gbps"])
            share = row["bw_gbps"] / best if best > 0 else 1.0
            heavy = small and row["bufs_mib_avg"] > 8
            drives = row["device_busy_min_pct"] >= 95 and not heavy
            if share < 0.95 or heavy:
                if drives:
                    busy += 1
                else:
                    bad += 1
                print(f"{path} qd {row['qd']}: auto {row['bw_gbps']:.1f} of best {best:.1f} "
                      f"({100 * share:.0f}%), bufs {row['bufs_mib_avg']:.1f} MiB"
                      f" (none {runs['none'][k]['bufs_mib_avg']:.1f})"
                      + (f", drives busy {row['device_busy_min_pct']:.0f}%+" if drives else ""))
    print(f"{bad} cases flagged in {n} scenarios (seed {seed}), "
          f"and {busy} more with every drive in use at least 95% busy")


if __name__ == "__main__":
    main(sys.argv[1:])
