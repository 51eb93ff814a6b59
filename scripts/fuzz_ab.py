#!/usr/bin/env python3
"""Two builds on the same fuzz cases: which pass, which goals each misses,
and the cases that flip.

    python3 scripts/fuzz_ab.py OLD_BIN NEW_BIN [SEED] [COUNT] [JOBS]
    python3 scripts/fuzz_ab.py --compare OLD.json NEW.json

Each build runs `iopace sim --fuzz SEED --count COUNT --json`. The
simulator is deterministic, so one run of each is the whole comparison:
any difference is the change's doing.
"""
import collections
import json
import subprocess
import sys

GOALS = ["host_share", "total", "buffers", "tenant_ratio", "qd1_latency", "books"]


def run(binary, seed, count, jobs):
    out = subprocess.run([binary, "sim", "--fuzz", str(seed), "--count", str(count),
                          "--json", "--jobs", str(jobs)], capture_output=True, text=True)
    return json.loads(out.stdout)


def tally(cases):
    goals = collections.Counter()
    for c in cases:
        for kind in {m["kind"] for m in c.get("misses", [])}:
            goals[kind] += 1
    return goals


def main():
    if sys.argv[1] == "--compare":
        old, new = (json.load(open(p)) for p in sys.argv[2:4])
    else:
        seed = sys.argv[3] if len(sys.argv) > 3 else "1"
        count = sys.argv[4] if len(sys.argv) > 4 else "100"
        jobs = sys.argv[5] if len(sys.argv) > 5 else "2"
        old = run(sys.argv[1], seed, count, jobs)
        new = run(sys.argv[2], seed, count, jobs)
    print("| | old | new |\n|---|---|---|")
    print(f"| pass | {sum(c['pass'] for c in old)} of {len(old)} | {sum(c['pass'] for c in new)} of {len(new)} |")
    to, tn = tally(old), tally(new)
    for g in GOALS:
        print(f"| {g} | {to[g]} | {tn[g]} |")
    worst_old = sum(c.get("worst_host_pct", 100) for c in old) / len(old)
    worst_new = sum(c.get("worst_host_pct", 100) for c in new) / len(new)
    print(f"| mean worst-host % | {worst_old:.1f} | {worst_new:.1f} |")
    print("\nflipped:")
    for a, b in zip(old, new):
        if a["pass"] != b["pass"]:
            kinds = sorted({m["kind"] for m in (b if a["pass"] else a).get("misses", [])})
            print(f"  {a['seed']}:{a['index']} {'pass -> FAIL' if a['pass'] else 'fail -> pass'}"
                  f" worst {a.get('worst_host_pct', 0):.0f} -> {b.get('worst_host_pct', 0):.0f} {kinds}")


if __name__ == "__main__":
    main()
