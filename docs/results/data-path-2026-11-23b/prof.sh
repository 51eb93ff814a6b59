#!/bin/bash
# prof.sh BIN RW QD [record] -> per-IO syscalls, context switches, server CPU
BIN=$1; RW=$2; QD=$3; REC=$4
D=$(mktemp -d /tmp/dp/run.XXXX)
$BIN serve ${CFG:+-c $CFG} --rpc none --unix $D/nbd.sock --tcp none >$D/log 2>&1 &
PID=$!
sleep 0.5
cat > $D/job.fio <<EOT
[j]
ioengine=nbd
uri=nbd+unix:///default?socket=$D/nbd.sock
rw=$RW
bs=4k
iodepth=$QD
time_based
runtime=5
size=1g
EOT
fio --output-format=json --output=$D/fio.json $D/job.fio >/dev/null 2>$D/fio.err &
FPID=$!
sleep 1.5
if [ -n "$REC" ]; then
  perf record -F 2000 --call-graph dwarf,16384 -o $D/perf.data -p $PID -- sleep 1.5 2>/dev/null >/dev/null
  echo $D/perf.data
else
  perf stat -e 'context-switches,task-clock,raw_syscalls:sys_enter,page-faults' -p $PID -x, -o $D/perf.txt -- sleep 2
fi
wait $FPID
kill $PID; wait $PID 2>/dev/null
[ -n "$REC" ] && exit 0
python3 - $D $RW <<'PY'
import json,sys
d,rw=sys.argv[1],sys.argv[2]
j=json.load(open(d+'/fio.json'))['jobs'][0]
k='read' if 'read' in rw else 'write'
iops=j[k]['iops']
vals={}
for l in open(d+'/perf.txt'):
    p=l.strip().split(',')
    if len(p)>3 and p[0] and p[0][0].isdigit(): vals[p[2]]=float(p[0])
ios=iops*2
print(f"{rw} qd={sys.argv[0] and ''}iops={iops:.0f} sys/io={vals.get('raw_syscalls:sys_enter',0)/ios:.3f} cs/io={vals.get('context-switches',0)/ios:.3f} cpu_us/io={vals.get('task-clock',0)*1000/ios:.2f} pf/io={vals.get('page-faults',0)/ios:.3f}")
PY
rm -rf $D/perf.txt
