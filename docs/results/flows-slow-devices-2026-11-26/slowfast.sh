#!/bin/bash
# slowfast.sh MODE: one reactor serving a slow export (a delay bdev, 1 ms,
# over RAM) and a fast one (RAM); fio nbd over Unix for RUNTIME (8) s:
# 128 KiB random reads at QD 32 to the slow export, and with FAST=1 also
# 128 KiB random reads at QD 32 to the fast one. TENANTS=1: the exports in
# two tenants of weight 1.
MODE=$1
D=$(mktemp -d); S=$D/s
[ "${TENANTS:-}" = 1 ] && TENANTS='[[pacing.tenants]]
name = "slow"
weight = 1
exports = ["slow"]
[[pacing.tenants]]
name = "fast"
weight = 1
exports = ["fast"]'

cat > $D/c.toml <<EOT
[server]
tcp = []
unix = ["$S"]
rpc = "$D/rpc"
reactors = 1
[pacing]
mode = "$MODE"
$TENANTS
[[bdev]]
name = "m1"
kind = "malloc"
size = "1GiB"
[[bdev]]
name = "slow"
kind = "delay"
base = "m1"
read_avg_us = 1000
read_p99_us = 1000
write_avg_us = 1000
write_p99_us = 1000
[[bdev]]
name = "m2"
kind = "malloc"
size = "1GiB"
[[export]]
name = "slow"
bdev = "slow"
[[export]]
name = "fast"
bdev = "m2"
EOT
${IOPACE} serve -c $D/c.toml >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
JOBS="--name=s --uri=nbd+unix:///slow?socket=$S --rw=randread --bs=128k --iodepth=32"
[ "$FAST" = 1 ] && JOBS="$JOBS --name=f --uri=nbd+unix:///fast?socket=$S --rw=randread --bs=128k --iodepth=32"
fio --ioengine=nbd --size=512m --time_based --runtime=${RUNTIME:-8} --output-format=json $JOBS >$D/fio.json 2>/dev/null
kill $P; wait $P 2>/dev/null
python3 -c "
import json;t=open('$D/fio.json').read();js=json.loads(t[t.index('{'):])['jobs']
print('$MODE fast=${FAST:-0} tenants=${TENANTS:+1}', ' '.join(j['jobname']+' '+str(round(j['read']['bw']/1024))+' MiB/s' for j in js))"
rm -rf $D
