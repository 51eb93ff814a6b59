#!/bin/bash
# nbdkit.sh RW SRV_CPUS FIO_CPUS
W=/tmp/q1/n; rm -rf $W; mkdir -p $W
taskset -c $2 nbdkit -f --exit-with-parent -U $W/s.sock memory 1G & PID=$!
sleep 0.5
fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --rw=write --bs=1m --size=256m --iodepth=8 > /dev/null
taskset -c $3 fio --name=r --ioengine=nbd --uri="nbd+unix:///?socket=$W/s.sock" --rw=$1 --bs=4k --size=256m --iodepth=1 --time_based --runtime=4 --output-format=json > $W/fio.json
kill $PID; wait $PID 2>/dev/null
python3 -c "
import json;t=open('$W/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0]
s=j['read'] if j['read']['total_ios'] else j['write']
print(f\"nbdkit srv=$2 fio=$3 $1 iops {s['iops']:8.0f} lat {s['lat_ns']['mean']/1000:6.1f}\")"
