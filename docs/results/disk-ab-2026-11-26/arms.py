#!/usr/bin/env python3
"""The write follow-up (ab.sh with ARMS): python3 arms.py OUT [--jsonl FILE]

One case, several builds a rep. Per rep each arm's MiB/s (and its place in
the rep's order), then per arm: mean (min-max) MiB/s, p99, pacer MiB in
flight, learned depth at the end, and its ratio to `ref` in the same rep
(mean, min-max, reps above ref), and to `now` likewise."""
import json, os, re, statistics as st, sys
# summary.py's load(), without running its main()
here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "summary.py")).read().replace("\nmain()\n", "\n")
ns = {}; exec(compile(src, "summary.py", "exec"), ns); load = ns["load"]

args = sys.argv[1:]
jsonl = None
if "--jsonl" in args:
    i = args.index("--jsonl"); jsonl = args[i + 1]; del args[i:i + 2]
out = args[0]
runs = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"r(\d+)-(rd|wr|mix)-(.*)$", name)
    if m and os.path.exists(os.path.join(out, name, "stats1.json")):
        runs[name] = load(os.path.join(out, name)) | {"rep": int(m[1]), "case": m[2], "arm": m[3]}
if jsonl:
    with open(jsonl, "w") as f:
        for name, r in runs.items():
            f.write(json.dumps({"run": name} | r, sort_keys=True) + "\n")
arms = []
for r in sorted(runs.values(), key=lambda r: (r["rep"], r["start"])):
    if r["arm"] not in arms:
        arms.append(r["arm"])
arms.sort(key=lambda a: ["ref", "devq", "yield", "qhold", "now"].index(a) if a in ["ref", "devq", "yield", "qhold", "now"] else 99)
reps = sorted({r["rep"] for r in runs.values()})
case = next(iter(runs.values()))["case"]
get = lambda n, a: runs.get(f"r{n}-{case}-{a}")
mib = lambda r: sum(j["mibs"] for j in r["jobs"].values())

print(f"## {case}: MiB/s per rep (order in the rep in brackets)\n")
print("| rep | " + " | ".join(arms) + " |")
print("|---|" + "---|" * len(arms))
for n in reps:
    order = sorted(arms, key=lambda a: get(n, a)["start"] if get(n, a) else "99")
    cells = [f"{mib(get(n, a)):.0f} [{order.index(a) + 1}]" if get(n, a) else "-" for a in arms]
    print(f"| {n} | " + " | ".join(cells) + " |")

mm = lambda v, f: f.format(st.mean(v)) + " (" + f.format(min(v)) + "-" + f.format(max(v)) + ")"
print("\n| arm | version | n | MiB/s | p99 ms | pacer MiB in flight | buffers in use | depth at end | / ref same rep | above ref | / now same rep | above now |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for a in arms:
    rs = [get(n, a) for n in reps if get(n, a)]
    big = lambda r: r["jobs"].get("uni") or r["jobs"]["large"]
    cells = [a, rs[0]["version"].split("commit ")[-1].rstrip(")")[:7], str(len(rs)),
             mm([mib(r) for r in rs], "{:.0f}"), mm([big(r)["p99_ms"] for r in rs], "{:.2f}"),
             mm([r["server"]["pacer_mib"] for r in rs], "{:.2f}"), mm([r["server"]["buffers"] for r in rs], "{:.1f}"),
             mm([r["server"]["depth_end"] for r in rs], "{:.2f}")]
    for base in ("ref", "now"):
        q = [mib(get(n, a)) / mib(get(n, base)) for n in reps if get(n, a) and get(n, base)]
        cells += ["-", "-"] if a == base or not q else [mm(q, "{:.3f}"), f"{sum(x > 1 for x in q)}/{len(q)}"]
    print("| " + " | ".join(cells) + " |")
