#!/bin/bash
# mix3.sh MODE: iopace serving two devices, two fio nbd jobs at once for RUNTIME (10) s:
# 128 KiB random writes QD 32 to the disk (file bdev, O_DIRECT) and 4 KiB random reads
# QD 1 to READER's export: "ram" (another device) or "disk" (the same one).
MODE=$1; READER=${READER:-ram}
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
[[bdev]]
name = "m"
kind = "malloc"
size = "256MiB"
[[export]]
name = "disk"
bdev = "d"
[[export]]
name = "ram"
bdev = "m"
EOT
${IOPACE} serve -c $D/c.toml >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --ioengine=nbd --size=256m --time_based --runtime=${RUNTIME:-10} --output-format=json \
  --name=w --uri="nbd+unix:///disk?socket=$S" --rw=randwrite --bs=128k --iodepth=32 \
  --name=r --uri="nbd+unix:///$READER?socket=$S" --rw=randread --bs=4k --iodepth=1 >$D/fio.json 2>/dev/null
${IOPACE} stats --rpc $D/rpc > $D/stats.txt 2>&1
kill $P; wait $P 2>/dev/null
python3 -c "
import json;t=open('$D/fio.json').read();js=json.loads(t[t.index('{'):])['jobs']
w=js[0]['write'];r=js[1]['read']
print('$MODE reader=$READER w', round(w['bw']/1024), 'MiB/s; r', round(r['iops']), 'IOPS p50', round(r['clat_ns']['percentile']['50.000000']/1000), 'p99', round(r['clat_ns']['percentile']['99.000000']/1000), 'us')"
grep -i 'depth' $D/stats.txt | head -2
rm -rf $D
