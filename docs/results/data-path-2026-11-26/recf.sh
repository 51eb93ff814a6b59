#!/bin/bash
BIN=$1; RW=$2; QD=$3; OUT=$4
D=$(mktemp -d); S=$D/s
$BIN serve -c $(dirname $0)/filecfg.toml --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=c --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=$RW --bs=${BS:-4k} --size=2g --iodepth=$QD --time_based --runtime=5 --output-format=json >$D/fio.json 2>/dev/null & F=$!
sleep 1.5
perf record -F 4000 -g -o $OUT -p $P -- sleep 2 >/dev/null 2>&1
wait $F; kill $P; wait $P 2>/dev/null
python3 -c "import json;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write';print('iops',j[k]['iops'])"
rm -rf $D
