#!/bin/bash
# usage: bufs.sh BIN RW BS QD -> "iops MiB/s bufs_avg_mib bufs_max_mib"
B=$1
rm -f /tmp/iopace-sb.sock
$B serve --config $(dirname $0)/malloc.toml > /tmp/iopace-sb-serve.log 2>&1 &
P=$!
for i in $(seq 50); do [ -S /tmp/iopace-sb.sock ] && break; sleep 0.1; done
R=$(fio --name=q --ioengine=nbd --uri="nbd+unix:///bench?socket=/tmp/iopace-sb.sock" --rw=$2 --bs=$3 --iodepth=$4 --runtime=5 --ramp_time=1 --time_based --size=256m --output-format=json --output=/tmp/iopace-sb-fio.json >/dev/null; python3 -c "import json,sys; j=json.load(open('/tmp/iopace-sb-fio.json'))['jobs'][0]; r=j['read'] if j['read']['iops']>0 else j['write']; print(round(r['iops']), round(r['bw']/1024), round(r['clat_ns']['percentile']['99.000000']/1000))")
S=$($B stats --rpc /tmp/iopace-sb.rpc --json 2>/dev/null | python3 -c "
import json,sys; j=json.load(sys.stdin); rs=j['reactors']
print(round(sum(r['buffers']['in_use_avg_mib'] for r in rs),2), round(sum(r['buffers']['in_use_max_mib'] for r in rs),2))" 2>/dev/null)
echo "$R $S"
kill $P; wait $P 2>/dev/null
