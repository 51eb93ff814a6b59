#!/usr/bin/env python3
"""Numbers for README.md out of runN/result.json: the cost model, the
held-out mixes, and the 4 KiB random read/write QD curves against
QD / (alone + (QD - 1) * cost) from the alternated QD 1 and QD 64 points."""
import json, sys
for run in sys.argv[1:]:
    d = json.load(open(f"{run}/result.json"))["devices"][0]
    c = d["cost"]
    print(run, " ".join(f"{k}={c[k]:.0f}" for k in ["rbps","rseqiops","rrandiops","wbps","wseqiops","wrandiops"]),
          f"cost_s={d['cost_s']:.1f} elapsed_s={d['elapsed_s']:.1f}")
    for p in d["predictions"]:
        w = p["workload"]
        print(f"  {w['read_pct']}% reads bs {w['bs']} alt {w['alt_bs']} QD {p['qd']}: linear {p['linear_iops']:.0f}"
              f" capacity {p['capacity_iops']:.0f} alone {p['unloaded_us']:.0f}us predicted {p['predicted_iops']:.0f}"
              f" measured {p['measured']['iops']:.0f} ({100*(p['measured']['iops']/p['predicted_iops']-1):+.1f}%)"
              f" linear err {100*(p['measured']['iops']/p['linear_iops']-1):+.1f}%")
    rows = {(r[1]["read_pct"], r[1]["bs"], r[1]["random"], r[2]): r[3]["iops"] for r in d["cost_points"] if r[1]["alt_bs"] is None}
    for cv, rp in [("4KiB random read", 100), ("4KiB random write", 0)]:
        alone = 1 / rows[(rp, 4096, True, 1)]
        t = 1 / rows[(rp, 4096, True, 64)]
        cost = max(t / 2, (64 * t - alone) / 63)
        curve = next(x for x in d["curves"] if x["label"] == cv)
        errs = []
        for pt in curve["points"]:
            q = pt["x"]; pred = q / (max(alone, cost) + (q - 1) * cost)
            errs.append(f"QD{q} {pred:.0f}/{pt['m']['iops']:.0f} ({100*(pt['m']['iops']/pred-1):+.0f}%)")
        print(f"  {cv} curve, predicted/measured: " + ", ".join(errs))
