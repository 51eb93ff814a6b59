#!/bin/bash
# ab128.sh BIN: 128k randread QD32 over Unix, written data, env A/B on IOPACE_ASYNC_SEND
W=/tmp/q1/ab; mkdir -p $W
. "$(dirname "$0")/../lend-2026-11-25/serve.sh"
run() { # label envval
  IOPACE_SNDBUF=$2 start_server $BIN
  fill_export
  local t0=$(awk '{print $14+$15}' /proc/$PID/stat)
  read_128k 5
  local t1=$(awk '{print $14+$15}' /proc/$PID/stat)
  local th=$(ls /proc/$PID/task | wc -l)
  stop_server
  fio_mibs | awk -v l=$1 -v ticks=$((t1 - t0)) -v th=$th \
    '{printf "%s %.0f MiB/s cpu/io %.1f us threads %d\n", l, $1, ticks * 1e4 / $2, th}'
}
for i in 1 2 3; do
  for v in ${VALS:-0 65536}; do run async=$v $v; done
done
