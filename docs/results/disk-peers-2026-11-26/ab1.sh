#!/bin/bash
# ab1.sh BIN KIND RW QD: IOPS, p99 and server CPU per IO, 4 KiB, fio nbd unix 5 s; KIND file|malloc
BIN=$1; KIND=$2; RW=$3; QD=$4
D=$(mktemp -d); S=$D/s
if [ $KIND = file ]; then B="kind = \"file\"
path = \"${IMG:-/var/tmp/iopace-peers-iopace-file.img}\""; else B="kind = \"malloc\"
size = \"1GiB\""; fi
printf '[server]\ntcp = []\nunix = ["%s"]\nrpc = "none"\n[[bdev]]\nname = "d"\n%s\n[[export]]\nname = "bench"\nbdev = "d"\n' "$S" "$B" > $D/c.toml
sed -i 's/^rpc = "none"$//' $D/c.toml
$BIN serve -c $D/c.toml --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
[ $KIND = malloc ] && fio --name=w --ioengine=nbd --uri="nbd+unix:///bench?socket=$S" --rw=write --bs=1m --size=256m >/dev/null 2>&1
t0=$(awk '{print $14+$15}' /proc/$P/stat)
fio --name=c --ioengine=nbd --uri="nbd+unix:///bench?socket=$S" --rw=$RW --bs=4k --size=256m --iodepth=$QD --time_based --runtime=5 --output-format=json >$D/fio.json 2>/dev/null
t1=$(awk '{print $14+$15}' /proc/$P/stat)
kill $P; wait $P 2>/dev/null
python3 -c "
import json,os;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write'
s=j[k];ios=s['total_ios'];cpu=($t1-$t0)/os.sysconf('SC_CLK_TCK')*1e6
print('$KIND $RW qd$QD iops=%d p99=%.0f cpu_us/io=%.1f'%(s['iops'],s['clat_ns']['percentile']['99.000000']/1000,cpu/ios))"
rm -rf $D
