#!/bin/bash
# modes.sh MODE RW BS QD: iopace file bdev under pacing MODE, fio nbd unix RUNTIME (5) s; prints IOPS MiB/s
MODE=$1; RW=$2; BS=$3; QD=$4
D=$(mktemp -d); S=$D/s
IMG=${IMG:-/var/tmp/iopace-peers-iopace-file.img}
cat > $D/c.toml <<EOT
[server]
tcp = []
unix = ["$S"]
rpc = "$D/rpc"
[pacing]
mode = "$MODE"
$EXTRA
[[bdev]]
name = "d"
kind = "file"
path = "$IMG"
[[export]]
name = "bench"
bdev = "d"
EOT
${IOPACE:-/work/main/target/release/iopace} serve -c $D/c.toml >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=c --ioengine=nbd --uri="nbd+unix:///bench?socket=$S" --rw=$RW --bs=$BS --size=256m --iodepth=$QD --time_based --runtime=${RUNTIME:-5} --output-format=json >$D/fio.json 2>/dev/null
${IOPACE:-/work/main/target/release/iopace} stats --rpc $D/rpc > $D/stats.txt 2>&1
kill $P; wait $P 2>/dev/null
python3 -c "import json;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write';print('$MODE $RW $BS qd$QD', round(j[k]['iops']), round(j[k]['bw']/1024), 'MiB/s')"
[ -n "$FULLSTATS" ] && cat $D/stats.txt
grep -i "window\|vrate\|cost" $D/stats.txt | head -5
rm -rf $D
