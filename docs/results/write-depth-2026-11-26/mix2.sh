#!/bin/bash
# mix2.sh MODE: iopace file bdev, two fio nbd jobs at once for RUNTIME s: 128 KiB writes QD 32 and 4 KiB randread QD 1
MODE=$1
D=$(mktemp -d); S=$D/s
IMG=${IMG:-/var/tmp/iopace-peers-iopace-file.img}
cat > $D/c.toml <<EOT
[server]
tcp = []
unix = ["$S"]
rpc = "$D/rpc"
[pacing]
mode = "$MODE"
[[bdev]]
name = "d"
kind = "file"
path = "$IMG"
[[export]]
name = "bench"
bdev = "d"
EOT
${IOPACE} serve -c $D/c.toml >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --ioengine=nbd --uri="nbd+unix:///bench?socket=$S" --size=256m --time_based --runtime=${RUNTIME:-10} --output-format=json \
  --name=w --rw=randwrite --bs=128k --iodepth=32 --name=r --rw=randread --bs=4k --iodepth=1 >$D/fio.json 2>/dev/null
${IOPACE} stats --rpc $D/rpc > $D/stats.txt 2>&1
kill $P; wait $P 2>/dev/null
python3 -c "
import json;t=open('$D/fio.json').read();js=json.loads(t[t.index('{'):])['jobs']
w=js[0]['write'];r=js[1]['read']
print('$MODE w', round(w['bw']/1024), 'MiB/s; r', round(r['iops']), 'IOPS p50', round(r['clat_ns']['percentile']['50.000000']/1000), 'p99', round(r['clat_ns']['percentile']['99.000000']/1000), 'us')"
grep 'bytes in flight' $D/stats.txt | sort | tail -1 | sed 's/.*MiB now, //'
rm -rf $D
