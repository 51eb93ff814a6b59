#!/bin/bash
# perf of iopace serving 128 KiB reads over Unix at QD 32 (data written first).
# [BIN=path] sh perf.sh; the report in /tmp/perf128/report.txt
W=/tmp/perf128; rm -rf $W; mkdir -p $W
. "$(dirname "$0")/serve.sh"
start_server ${BIN:-target/release/iopace}
fill_export
read_128k 12 &
F=$!
sleep 3
perf record -g -p $PID -o $W/perf.data -- sleep 6 2> $W/perf.err
wait $F
stop_server
perf report -i $W/perf.data --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -v '^$' | head -120 > $W/report.txt
fio_mibs | awk '{print "MiB/s", $1}'
