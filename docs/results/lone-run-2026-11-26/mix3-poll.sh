#!/bin/bash
# A copy of ../lone-device-2026-11-26/mix3.sh with diag.sh's get_stats poll added
# (every 0.25 s from 1 s in): the share of polls with each count of held devices
# (the lone-client hold; reactor 0's pacer, the holds are shared by all reactors).
# Same server config and fio jobs as mix3.sh; prints mix3.sh's line plus "held".
#   READER=ram|disk IOPACE=bin RUNTIME=8 mix3-poll.sh auto
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
  --name=r --uri="nbd+unix:///$READER?socket=$S" --rw=randread --bs=4k --iodepth=1 >$D/fio.json 2>/dev/null & F=$!
sleep 1
while kill -0 $F 2>/dev/null; do
  ${IOPACE} rpc get_stats --rpc $D/rpc 2>/dev/null | jq -c '[.reactors[0].pacer.held_devices, .reactors[0].pacer.depth]' >> $D/poll || true
  sleep 0.25
done
wait $F
${IOPACE} stats --rpc $D/rpc > $D/stats.txt 2>&1
kill $P; wait $P 2>/dev/null
python3 -c "
import json;t=open('$D/fio.json').read();js=json.loads(t[t.index('{'):])['jobs']
w=js[0]['write'];r=js[1]['read']
ps=[json.loads(l) for l in open('$D/poll') if l.strip()]
h=lambda k: sum(1 for p in ps if p[0]==k)/max(len(ps),1)*100
print('$MODE reader=$READER w', round(w['bw']/1024), 'MiB/s; r', round(r['iops']), 'IOPS p50', round(r['clat_ns']['percentile']['50.000000']/1000), 'p99', round(r['clat_ns']['percentile']['99.000000']/1000), 'us;',
      f'held 0/1/2 devices in {h(0):.0f}/{h(1):.0f}/{h(2):.0f}% of {len(ps)} polls; mean depth {sum(p[1] for p in ps)/max(len(ps),1):.2f}')"
grep -i 'depth' $D/stats.txt | head -2
rm -rf $D
