#!/bin/bash
# one disk, REACTORS reactors, 3 clients (4k/256k/1m random reads QD 32), mode A vs B
BIN=${BIN:-/work/main/target/release/iopace}
W=/tmp/sd; R=${REACTORS:-2}
one() { # mode
  rm -f $W/s.sock $W/rpc.sock
  cat > $W/c.toml <<EOC
[server]
tcp = []
unix = ["$W/s.sock"]
rpc = "$W/rpc.sock"
reactors = $R
[pacing]
mode = "$1"
[[bdev]]
name = "disk"
kind = "file"
path = "/var/tmp/iopace-probe.img"
[[export]]
name = "disk"
bdev = "disk"
EOC
  $BIN serve --config $W/c.toml > $W/serve.log 2>&1 &
  local pid=$!
  sleep 0.5
  fio --ioengine=nbd --uri="nbd+unix:///disk?socket=$W/s.sock" --rw=randread --size=2g --time_based --runtime=${RT:-10} --ramp_time=2 --output-format=json \
    --name=s4k --bs=4k --iodepth=32 --name=s256k --bs=256k --iodepth=32 --name=s1m --bs=1m --iodepth=32 > $W/fio.json 2>$W/fio.err
  kill $pid; wait $pid
  python3 -c "
import json;t=open('$W/fio.json').read();J=json.loads(t[t.index('{'):])['jobs']
bw=[j['read']['bw_bytes']/2**20 for j in J]
print('%-5s total %5.0f MiB/s  4k %5.0f  256k %5.0f  1m %5.0f  4k p99 %.0f us' % ('$1', sum(bw), *bw, J[0]['read']['clat_ns']['percentile']['99.000000']/1000))"
}
if [ "${1:-}" = one ]; then one $2; exit; fi
for i in $(seq ${REPS:-2}); do for m in ${MODES:-none auto}; do flock /work/wt/bench.lock "$0" one $m; done; done
