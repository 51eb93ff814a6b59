import csv,collections,statistics as st,sys
d=collections.defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    if r['host'] not in ('h1',): continue
    v=r['vars']; rw='randread' if 'randread' in v else 'randwrite'
    d[(r['test'].split('_')[-1],rw,int(r['total_qd']),r['target'])].append((float(r['kiops']),float(r['p99_us']),float(r['cpu_us_per_io'])))
keys=sorted(set(k[:3] for k in d))
print('| transport | rw | QD | kIOPS new | kIOPS base | p99 us new | p99 us base | CPU/IO us new | CPU/IO us base |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|')
for k in keys:
    n=d[k+('iopace',)]; b=d[k+('iopace-base',)]
    f=lambda L,i,fmt: fmt%st.median(x[i] for x in L)+' ('+'/'.join(fmt%x[i] for x in L)+')'
    print('|',k[0],'|',k[1],'|',k[2],'|',f(n,0,'%.1f'),'|',f(b,0,'%.1f'),'|',f(n,1,'%.0f'),'|',f(b,1,'%.0f'),'|',f(n,2,'%.2f'),'|',f(b,2,'%.2f'),'|')
