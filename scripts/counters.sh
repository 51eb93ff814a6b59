#!/bin/bash
# scripts/counters.sh BIN RW QD [N]: one fio run of N 4 KiB IOs (fio nbd engine, Unix socket)
# against BIN's embedded default export, and the server's software counters per IO
# (perf stat -p: CPU time, context switches, io_uring_enter calls). PIN_S / PIN_F pin the
# server and fio to CPU lists (taskset), which removes the same-core/other-core
# bimodality of QD 1 on a 2-core machine. Needs fio and perf.
BIN=$1; RW=$2; QD=$3; N=${4:-200000}
D=$(mktemp -d); S=$D/s
${PIN_S:+taskset -c $PIN_S} $BIN serve --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
# warm the export so reads hit written pages in both builds
fio --name=w --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=write --bs=1m --size=256m >/dev/null 2>&1
perf stat -x, -e task-clock,context-switches,syscalls:sys_enter_io_uring_enter -p $P -o $D/perf 2>/dev/null &
PP=$!; sleep 0.3
${PIN_F:+taskset -c $PIN_F} fio --name=c --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=$RW --bs=4k --size=256m --iodepth=$QD --number_ios=$N --time_based=0 --output-format=json >$D/fio.json 2>/dev/null
kill -INT $PP; wait $PP 2>/dev/null
kill $P; wait $P 2>/dev/null
python3 - "$D" "$RW" "$N" <<'PY'
import json,sys
d,rw,n=sys.argv[1],sys.argv[2],int(sys.argv[3])
t=open(d+"/fio.json").read(); j=json.loads(t[t.index("{"):])["jobs"][0]
k="read" if "read" in rw else "write"
ios=j[k]["total_ios"]; iops=j[k]["iops"]
c={}
for l in open(d+"/perf"):
    p=l.strip().split(",")
    if len(p)>3 and p[0] and p[0][0].isdigit(): c[p[2]]=float(p[0])
out=f"iops={iops/1000:.1f}k ios={ios}"
for key,name in [("task-clock","cpu_us"),("context-switches","cs"),("syscalls:sys_enter_io_uring_enter","enter")]:
    v=c.get(key)
    if v is None: continue
    if key=="task-clock": v=v*1000  # msec -> us
    out+=f" {name}/io={v/ios:.3f}"
print(out)
PY
rm -rf $D
