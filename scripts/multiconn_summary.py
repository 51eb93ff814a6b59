#!/usr/bin/env python3
"""Summary of `iopace bench scenarios/multiconn.toml --out DIR` as a markdown table.

Usage: scripts/multiconn_summary.py DIR

Reads DIR/runs/*.json (one file per run) and prints, per rw, target and
numjobs: kIOPS (median of the repetitions, with min-max), the server's CPU
per IO (median), and for iopace the open connections on each reactor and
how the replies split between reactors: each reactor's share of the replies
(median over repetitions) and max/min, the busiest reactor's replies as a
percentage of the idlest's (100% is an even split). It also prints the
same max/min for the fio jobs, that is the connections (from
DIR/logs/KEY-fio.json, which the bench keeps): whether every connection got
served, for every target.
"""
import glob
import json
import os
import statistics
import sys

TARGET_ORDER = ["iopace-r1", "iopace-r2", "nbdkit", "qemu-nbd"]


def load(out_dir):
    runs = []
    for path in sorted(glob.glob(os.path.join(out_dir, "runs", "*.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    if not runs:
        sys.exit(f"multiconn_summary: no runs in {out_dir}/runs")
    return runs


def group(runs):
    groups = {}
    for r in runs:
        key = (r["vars"].get("rw", "?"), r["target"], int(r["vars"].get("numjobs", 1)))
        groups.setdefault(key, []).append(r)
    return groups


def reactor_split(runs):
    """(connections per reactor, share of replies per reactor in %, max/min %).

    Connections are the most common list over the repetitions (they should
    agree); shares and max/min are medians over the repetitions. Peers and
    runs without per-reactor numbers give None.
    """
    conns = [tuple(r["stats"].get("reactor_connections", [])) for r in runs]
    conns = [c for c in conns if c]
    rates = [r["stats"].get("reactor_replies_per_s", []) for r in runs]
    rates = [x for x in rates if x and sum(x) > 0]
    if not conns or not rates:
        return None
    common = max(set(conns), key=conns.count)
    shares = [[100.0 * v / sum(x) for v in x] for x in rates]
    share = [statistics.median(s[i] for s in shares) for i in range(len(shares[0]))]
    # An idle reactor makes max/min infinite: report it as such.
    ratios = [100.0 * max(x) / min(x) if min(x) > 0 else float("inf") for x in rates]
    return common, share, statistics.median(ratios)


def fio_doc(path):
    """fio's JSON: `--client` output has status lines before it."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    # find() gives -1 without a JSON object: start 0, and the parse fails.
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def job_ratio(out_dir, run):
    """Busiest fio job's IOPS as a percentage of the slowest's, one run."""
    doc = fio_doc(os.path.join(out_dir, "logs", f"{run.get('key', '')}-fio.json"))
    if doc is None:
        return None
    jobs = doc.get("client_stats", doc.get("jobs", []))
    iops = [
        sum(j.get(d, {}).get("iops", 0.0) for d in ("read", "write"))
        for j in jobs
        if j.get("jobname") != "All clients"
    ]
    if len(iops) < 2:
        return None
    return 100.0 * max(iops) / min(iops) if min(iops) > 0 else float("inf")


def pct(x):
    return "inf" if x == float("inf") else f"{x:.0f}%"


def row(out_dir, rw, target, numjobs, runs):
    kiops = [r["fio"]["total"]["kiops"] for r in runs]
    cpu = [r["stats"]["cpu_us_per_io"] for r in runs]
    split = reactor_split(runs)
    conns = share = ratio = "-"
    if split is not None:
        c, s, m = split
        conns = "/".join(str(v) for v in c)
        share = "/".join(f"{v:.0f}" for v in s)
        ratio = pct(m)
    jobs = [x for x in (job_ratio(out_dir, r) for r in runs) if x is not None]
    job = pct(statistics.median(jobs)) if jobs else "-"
    return (
        f"| {rw} | {target} | {numjobs} | {statistics.median(kiops):.1f} "
        f"({min(kiops):.1f}-{max(kiops):.1f}) | {statistics.median(cpu):.2f} "
        f"| {conns} | {share} | {ratio} | {job} | {len(runs)} |"
    )


def order(key):
    rw, target, numjobs = key
    t = TARGET_ORDER.index(target) if target in TARGET_ORDER else len(TARGET_ORDER)
    return (rw, t, target, numjobs)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    groups = group(load(sys.argv[1]))
    print(
        "| rw | target | numjobs | kIOPS median (min-max) | server CPU us/IO "
        "| conns per reactor | replies per reactor % | reactors max/min "
        "| connections max/min | reps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(groups, key=order):
        print(row(sys.argv[1], *key, groups[key]))


if __name__ == "__main__":
    main()
