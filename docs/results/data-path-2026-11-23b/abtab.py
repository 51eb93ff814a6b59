#!/usr/bin/env python3
"""abtab.py results.csv -> markdown median (min-max) table per point, new vs base."""
import csv,sys,statistics as st,re
rows=[r for r in csv.DictReader(open(sys.argv[1])) if r['host']=='Total']
pts={}
for r in rows:
    v=dict(x.split('=',1) for x in r['vars'].split())
    k=(v['rw'],int(v['qd']))
    pts.setdefault(k,{}).setdefault(r['target'],[]).append(r)
def f(vals,fmt):
    return f"{fmt.format(st.median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"
tg=sorted({r['target'] for r in rows})
base=[t for t in tg if 'base' in t][0]; new=[t for t in tg if t!=base][0]
print(f"| rw | QD | kIOPS {new} | kIOPS base | p99 us {new} | p99 us base | CPU/IO us {new} | CPU/IO us base |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (rw,qd),d in sorted(pts.items()):
    cells=[]
    for key,fmt in (('kiops','{:.1f}'),('p99_us','{:.0f}'),('cpu_us_per_io','{:.2f}')):
        for t in (new,base):
            cells.append(f([float(r[key]) for r in d[t]],fmt))
    print(f"| {rw} | {qd} | "+" | ".join(cells)+" |")
