#!/bin/bash
# ab.sh: 128 KiB randread QD 32 over Unix from a 1 GiB malloc export, written
# (fill=1: 256 MiB written first) and never written (fill=0), two builds
# alternating, the new one first. BASE=path NEW=path sh ab.sh
W=/tmp/zcab; mkdir -p $W
. "$(dirname "$0")/serve.sh"
run() { # bin fill label
  start_server $1
  [ $2 = 1 ] && fill_export
  local t0=$(awk '{print $14+$15}' /proc/$PID/stat)
  read_128k 5
  local t1=$(awk '{print $14+$15}' /proc/$PID/stat)
  stop_server
  fio_mibs | awk -v l=$3 -v f=$2 -v ticks=$((t1 - t0)) \
    '{printf "%s fill=%s %.0f MiB/s cpu/io %.1f us\n", l, f, $1, ticks * 1e4 / $2}'
}
for i in 1 2 3; do
  for f in 1 0; do
    run $NEW $f new; run $BASE $f base
  done
done
