#!/bin/sh
# usage: fiopt.sh NAME QD RWMIXREAD BSSPLIT [RUNTIME]
# one fio point on the probe file: io_uring, O_DIRECT, random, prints name qd iops MB/s mean-lat-us
name=$1 qd=$2 mix=$3 bs=$4 rt=${5:-6}
out=/work/wt/probe-data/fio/$name-qd$qd-$(date +%H%M%S).json
fio --name=$name --filename=/var/tmp/iopace-probe.img --ioengine=io_uring --direct=1 \
  --rw=randrw --rwmixread=$mix --bssplit=$bs --iodepth=$qd \
  --time_based --runtime=$rt --ramp_time=1 --norandommap --randrepeat=0 \
  --output-format=json --output=$out >/dev/null 2>&1
jq -r --arg n "$name" --arg q "$qd" '.jobs[0] | [$n, $q, ((.read.iops + .write.iops)|floor), (((.read.bw_bytes + .write.bw_bytes)/1e6)|floor), (((.read.lat_ns.mean*.read.iops + .write.lat_ns.mean*.write.iops)/(.read.iops+.write.iops)/1000)|floor)] | @tsv' $out
