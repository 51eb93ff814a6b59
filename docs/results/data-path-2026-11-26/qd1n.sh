#!/bin/bash
# qd1n.sh RW: nbdkit memory at QD 1 4k, 3 s, pinned per PIN_S/PIN_F, IOPS
RW=$1
D=$(mktemp -d); S=$D/s
${PIN_S:+taskset -c $PIN_S} nbdkit -f -U $S memory 1G >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$S" --rw=write --bs=1m --size=64m >/dev/null 2>&1
${PIN_F:+taskset -c $PIN_F} fio --name=c --ioengine=nbd --uri="nbd+unix:///?socket=$S" --rw=$RW --bs=4k --size=64m --iodepth=1 --time_based --runtime=3 --output-format=json >$D/fio.json 2>/dev/null
kill $P; wait $P 2>/dev/null
python3 -c "import json;t=open('$D/fio.json').read();j=json.loads(t[t.index('{'):])['jobs'][0];k='read' if 'read' in '$RW' else 'write';print(round(j[k]['iops']))"
rm -rf $D
