#!/bin/bash
# idle.sh BIN: server CPU over 5 s with no client, after a short QD 1 run.
BIN=$1; D=$(mktemp -d); S=$D/s
$BIN serve --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=c --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=randwrite --bs=4k --size=64m --iodepth=1 --time_based --runtime=2 >/dev/null 2>&1
t0=$(awk '{print $14+$15}' /proc/$P/stat); sleep 5; t1=$(awk '{print $14+$15}' /proc/$P/stat)
echo "idle cpu: $(( (t1-t0) )) ticks in 5 s (CLK_TCK=$(getconf CLK_TCK))"
kill $P; wait $P 2>/dev/null; rm -rf $D
