#!/bin/sh
# The QD 1 probe alone (4 KiB random reads, RUNTIME s) against CONFIG
# served by BIN, REPS times: its p50 and p99, for the 2x-solo target.
# Usage: solo.sh CONFIG REPS BIN (holds LOCK for each run)
set -eu
cfg=$1 reps=$2 bin=$3
rt=${RUNTIME:-10}
dir=$(mktemp -d /tmp/iopace-solo-XXXXXX)
printf '[probe]\nioengine=nbd\ntime_based\nrw=randread\nbs=4k\niodepth=1\nruntime=%s\nsize=2g\nuri=nbd+unix:///probe?socket=%s/nbd.sock\n' "$rt" "$dir" >"$dir/job.fio"
i=0
while [ $i -lt "$reps" ]; do
    flock "${LOCK:-/work/wt/bench.lock}" sh -c '
        bin=$1 cfg=$2 dir=$3
        rm -f "$dir/nbd.sock" "$dir/rpc.sock"
        "$bin" serve --config "$cfg" --tcp none --unix "$dir/nbd.sock" --rpc "$dir/rpc.sock" 2>"$dir/serve.log" &
        pid=$!
        while [ ! -S "$dir/rpc.sock" ]; do sleep 0.1; done
        fio --output-format=json "$dir/job.fio" >"$dir/fio.json"
        kill $pid
        wait $pid || true
    ' sh "$bin" "$cfg" "$dir"
    python3 -c '
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.index("{"):])["jobs"][0]["read"]
p = r["clat_ns"]["percentile"]
iops, p50, p99 = r["iops"], p["50.000000"] / 1e3, p["99.000000"] / 1e3
print(f"solo rep {sys.argv[2]}: {iops:,.0f} IOPS, p50 {p50:.0f} us, p99 {p99:.0f} us")
' "$dir/fio.json" $((i + 1))
    i=$((i + 1))
done
rm -rf "$dir"
