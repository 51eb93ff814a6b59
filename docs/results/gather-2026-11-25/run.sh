#!/bin/bash
# run.sh BIN RW "EXTRA [server] TOML LINES" -> IOPS, latency, server CPU per IO
# of 4 KiB random IO at QD (default 1) for RT seconds (default 4) on a RAM
# export with 256 MiB written first. PIN_S / PIN_F: server / fio CPUs.
W=/tmp/q1/w; rm -rf $W; mkdir -p $W
. "$(dirname "$0")/../lend-2026-11-25/serve.sh"
BIN=$1; RW=$2; SERVER_EXTRA=$3
start_server $BIN
fill_export
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
${PIN_F:+taskset -c $PIN_F} fio --name=r --ioengine=nbd --uri="$(uri)" --rw=$RW --bs=4k --size=256m --iodepth=${QD:-1} --time_based --runtime=${RT:-4} --output-format=json > $W/fio.json
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
stop_server
LABEL="$SERVER_EXTRA" python3 -c "
import json,os;LABEL=os.environ['LABEL'];t=open('$W/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0]
s=j['read'] if j['read']['total_ios'] else j['write']
print(f\"{LABEL:40s} $RW iops {s['iops']:8.0f} lat {s['lat_ns']['mean']/1000:6.1f} us cpu/io {($((t1-t0)))*1e4/s['total_ios']:6.2f}\")"
