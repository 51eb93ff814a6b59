#!/usr/bin/env python3
"""Per-job IOPS and completion-latency percentiles of a bench run's fio logs.

    python3 jobs.py OUT_DIR    # OUT_DIR/logs/*-fio.json, one row per run and job

The bench report's p99 is the worst host's; with one local host running a
QD 64 `tenant` job and a QD 1 `probe` job, that is the tenant's. This
prints each job's own numbers (fio's clat percentiles), and per target
the mean over the runs.
"""
import glob
import json
import os
import sys
from collections import defaultdict


def load(path):
    text = open(path).read()
    return json.loads(text[text.index("{"):])  # fio client output precedes the JSON


def main(out):
    sums = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, "logs", "*-fio.json"))):
        run = os.path.basename(path)[: -len("-fio.json")]
        target = run.split("-")[-2]
        for j in load(path)["client_stats"]:
            name = j["jobname"].split(".")[1] if "." in j["jobname"] else None
            if name not in ("tenant", "probe"):
                continue
            r = j["read"]
            pct = r["clat_ns"]["percentile"]
            row = (r["iops"], r["lat_ns"]["mean"] / 1e3, pct["50.000000"] / 1e3,
                   pct["99.000000"] / 1e3, pct["99.900000"] / 1e3)
            sums[(target, name)].append(row)
            print(f"{run:40} {name:7} IOPS {row[0]:9.0f}  mean {row[1]:7.1f} us  "
                  f"p50 {row[2]:7.1f}  p99 {row[3]:7.1f}  p99.9 {row[4]:7.1f}")
    print()
    for (target, name), rows in sorted(sums.items()):
        m = [sum(c) / len(rows) for c in zip(*rows)]
        print(f"{target:5} {name:7} runs {len(rows)}  IOPS {m[0]:9.0f}  mean {m[1]:7.1f} us  "
              f"p50 {m[2]:7.1f}  p99 {m[3]:7.1f}  p99.9 {m[4]:7.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
