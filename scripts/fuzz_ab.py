#!/usr/bin/env python3
"""Two builds on the same fuzz cases: which pass, which goals each misses,
and the cases that flip.

    python3 scripts/fuzz_ab.py OLD_BIN NEW_BIN [SEED] [COUNT] [JOBS]
    python3 scripts/fuzz_ab.py --compare OLD.json NEW.json
    python3 scripts/fuzz_ab.py --classes RUN.json
    python3 scripts/fuzz_ab.py --knee RUN.json SCALED.json

`--knee` takes a run and the same cases at K x QD (`iopace sim --fuzz SEED
--qd-scale K`). A failing case whose host-share and total misses are gone
at K x QD missed at a QD knee: its hosts' QD nearly binds, and a closed
loop reaches the oracle's bound (QD over the unloaded round trip) only
well past it. The rest miss those goals with QD to spare.

`--classes` sorts one run's failing cases by what holds their missed
hosts in the oracle (QD, link, port or drive; "QD knee" when every missed
host's QD bound is under twice its ideal, out of a closed loop's reach).
"Pass" counts only valid cases: the broken ones pass by being rejected.

Each build runs `iopace sim --fuzz SEED --count COUNT --json`. The
simulator is deterministic, so one run of each is the whole comparison:
any difference is the change's doing.
"""
import collections
import json
import subprocess
import sys

# A host whose QD bound is under this many times its ideal rate is held by
# the closed loop's knee, not by the pacer (see docs/pacer.md).
KNEE = 2.0
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


def classes(cases):
    """The failing valid cases by the limits of their missed hosts."""
    valid = [c for c in cases if not c.get("broken")]
    out = collections.Counter()
    for c in valid:
        if c["pass"]:
            continue
        hosts = [m for m in c.get("misses", []) if m["kind"] == "host_share"]
        if hosts and all(m["qd_headroom"] < KNEE for m in hosts):
            out["QD knee (every missed host's QD bound < 2x its ideal)"] += 1
        elif hosts:
            out["missed hosts held by " + " + ".join(sorted({m["limit"] for m in hosts}))] += 1
        else:
            kinds = sorted({m["kind"] for m in c.get("misses", [])})
            out["no host under its share; misses " + ", ".join(kinds)] += 1
    print(f"{sum(c['pass'] for c in valid)} of {len(valid)} valid cases pass\n")
    print("| class | cases |\n|---|---|")
    for name, n in out.most_common():
        print(f"| {name} | {n} |")


SHARES = {"host_share", "total"}


def knee(run, scaled):
    """Each failing case of `run`: do its share misses go at K x QD?"""
    out = collections.defaultdict(list)
    for a, b in zip(run, scaled):
        assert (a["seed"], a["index"]) == (b["seed"], b["index"]), "the same cases"
        if a.get("broken") or a["pass"]:
            continue
        missed = {m["kind"] for m in a.get("misses", [])} & SHARES
        still = {m["kind"] for m in b.get("misses", [])} & SHARES
        if not missed:
            name = "misses no share goal (buffers, tenant ratio or QD 1 only)"
        elif not still:
            name = f"QD knee: shares met at {b['qd_scale']} x QD"
        else:
            name = f"shares missed at {b['qd_scale']} x QD too ({', '.join(sorted(still))})"
        out[name].append(f"{a['seed']}:{a['index']}")
    print("| class | cases | which |\n|---|---|---|")
    for name, ids in sorted(out.items(), key=lambda kv: -len(kv[1])):
        print(f"| {name} | {len(ids)} | {' '.join(ids)} |")


def main():
    if sys.argv[1] == "--knee":
        knee(*(json.load(open(p)) for p in sys.argv[2:4]))
        return
    if sys.argv[1] == "--classes":
        classes(json.load(open(sys.argv[2])))
        return
    if sys.argv[1] == "--compare":
        old, new = (json.load(open(p)) for p in sys.argv[2:4])
    else:
        seed = sys.argv[3] if len(sys.argv) > 3 else "1"
        count = sys.argv[4] if len(sys.argv) > 4 else "100"
        jobs = sys.argv[5] if len(sys.argv) > 5 else "2"
        old = run(sys.argv[1], seed, count, jobs)
        new = run(sys.argv[2], seed, count, jobs)
    print("| | old | new |\n|---|---|---|")
    def passed(cases):
        valid = [c for c in cases if not c.get("broken")]
        return f"{sum(c['pass'] for c in valid)} of {len(valid)} valid"
    print(f"| pass | {passed(old)} | {passed(new)} |")
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
