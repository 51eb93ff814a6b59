#!/bin/bash
# qd1.sh CFG RW: QD 1, 4 KiB, 3 s over a Unix socket, pinned per PIN_S (server)
# and PIN_F (fio); prints IOPS. CFG is an iopace config, or `nbdkit` for
# nbdkit's memory plugin.
CFG=$1; RW=$2
D=$(mktemp -d); S=$D/s
if [ "$CFG" = nbdkit ]; then
  ${PIN_S:+taskset -c $PIN_S} nbdkit -f -U $S memory 1G >$D/log 2>&1 & P=$!
  URI="nbd+unix:///?socket=$S"
else
  ${PIN_S:+taskset -c $PIN_S} ${IOPACE:-target/release/iopace} serve -c $CFG --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
  URI="nbd+unix:///default?socket=$S"
fi
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=w --ioengine=nbd --uri="$URI" --rw=write --bs=1m --size=64m >/dev/null 2>&1
${PIN_F:+taskset -c $PIN_F} fio --name=c --ioengine=nbd --uri="$URI" --rw=$RW --bs=4k --size=64m --iodepth=1 --time_based --runtime=3 --output-format=json >$D/fio.json 2>/dev/null
kill $P; wait $P 2>/dev/null
python3 -c "import json;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write';print(round(j[k]['iops']))"
rm -rf $D
