#!/bin/bash
# run.sh BIN RW EXTRA_SERVER_TOML -> IOPS lat
W=/tmp/q1/w; rm -rf $W; mkdir -p $W
BIN=$1; RW=$2; EXTRA=$3
cat > $W/c.toml <<EOC
[server]
tcp = []
unix = ["$W/s.sock"]
rpc = "$W/rpc.sock"
$EXTRA
[[bdev]]
name = "d"
kind = "malloc"
size = "1GiB"
[[export]]
name = "bench"
bdev = "d"
EOC
${PIN_S:+taskset -c $PIN_S} $BIN serve --config $W/c.toml > $W/serve.log 2>&1 &
PID=$!
sleep 0.7
fio --name=fill --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=write --bs=1m --size=256m --iodepth=8 > /dev/null
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
${PIN_F:+taskset -c $PIN_F} fio --name=r --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=$RW --bs=4k --size=256m --iodepth=${QD:-1} --time_based --runtime=${RT:-4} --output-format=json > $W/fio.json
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
kill $PID; wait $PID
LABEL="$EXTRA" python3 -c "
import json,os;LABEL=os.environ['LABEL'];t=open('$W/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0]
s=j['read'] if j['read']['total_ios'] else j['write']
print(f\"{LABEL:40s} $RW iops {s['iops']:8.0f} lat {s['lat_ns']['mean']/1000:6.1f} us cpu/io {($((t1-t0)))*1e4/s['total_ios']:6.2f}\")"
