#!/bin/bash
# rec.sh BIN RW QD OUT: perf record the server for 2 s under fio's nbd engine
# over a Unix socket. BS sets the block size (4k). CFG serves a config file
# (filecfg.toml: the disk) instead of the embedded default, whose RAM export
# is first written so reads carry data.
BIN=$1; RW=$2; QD=$3; OUT=$4
D=$(mktemp -d); S=$D/s; SIZE=256m
$BIN serve ${CFG:+-c $CFG} --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
if [ -z "$CFG" ]; then
  fio --name=w --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=write --bs=1m --size=$SIZE >/dev/null 2>&1
else
  SIZE=2g
fi
fio --name=c --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=$RW --bs=${BS:-4k} --size=$SIZE --iodepth=$QD --time_based --runtime=5 --output-format=json >$D/fio.json 2>/dev/null & F=$!
sleep 1.5
perf record -F 4000 -g -o $OUT -p $P -- sleep 2 >/dev/null 2>&1
wait $F; kill $P; wait $P 2>/dev/null
python3 -c "import json;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write';print('iops',j[k]['iops'])"
rm -rf $D
