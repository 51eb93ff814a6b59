#!/bin/sh
# In process (fio, io_uring, O_DIRECT), no iopace: the QD 1 probe beside an
# unthrottled 4 KiB random reader held to a queue depth of $1 (the lever a
# device in-flight cap would be), against tune's rate-throttled adversary.
# Writes fio-depth-qd$1.json and prints the adversary's IOPS and the
# probe's IOPS, p50 and p99 (us).
qd=$1
out=$(dirname "$0")/fio-depth-qd$qd.json
fio --output-format=json --output="$out" --filename=/var/tmp/iopace-probe.img --direct=1 \
    --ioengine=io_uring --rw=randread --bs=4k --norandommap --time_based --runtime=8 \
    --ramp_time=1 --name=adv --iodepth="$qd" --name=probe --iodepth=1
python3 - "$out" "$qd" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a, p = d["jobs"][0]["read"], d["jobs"][1]["read"]
pc = p["clat_ns"]["percentile"]
print("adversary QD %s: %.0f IOPS; probe %.0f IOPS, p50 %.0f us, p99 %.0f us"
      % (sys.argv[2], a["iops"], p["iops"], pc["50.000000"] / 1e3, pc["99.000000"] / 1e3))
PY
