#!/bin/sh
# one tuned run by hand, sampling each device's vrate (admin RPC) every second
/work/wt/probe/target/release/iopace serve --config "$1" > srv.log 2>&1 &
SRV=$!
sleep 1
fio --output-format=json --output=fio.json job.fio > /dev/null 2>&1 &
FIO=$!
for i in $(seq 1 14); do
  sleep 1
  /work/wt/probe/target/release/iopace stats --rpc /tmp/t12/admin.sock --json | python3 -c "
import json,sys; d=json.load(sys.stdin); print('t=$i', [r['pacer']['vrates'] for r in d['reactors']] if 'reactors' in d else str(d)[:300])"
done
wait $FIO
kill -TERM $SRV; wait $SRV
python3 -c "
import json;d=json.load(open('fio.json'))
for j in d['jobs']: print(j['jobname'], round(j['read']['iops']), round(j['read']['clat_ns']['percentile']['99.000000']/1e3))"
