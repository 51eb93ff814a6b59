#!/bin/sh
# Wakes per IO: serves CONFIG with each build in turn (alternating, REPS
# times), drives it with fio as scenarios/tune_effect_ab.toml does (tenant
# QD 64, probe QD 1, 4 KiB random reads, RUNTIME s), then reads the
# server's counters by admin RPC: reactor loop iterations, pacer polls and
# replies, and the server's CPU (utime + stime) from /proc.
# Usage: loops.sh CONFIG REPS BIN... (holds LOCK for each run)
set -eu
cfg=$1 reps=$2
shift 2
rt=${RUNTIME:-10}
dir=$(mktemp -d /tmp/iopace-loops-XXXXXX)
cat >"$dir/job.fio" <<JOB
[global]
ioengine=nbd
time_based
rw=randread
bs=4k
iodepth=64
runtime=$rt
size=2g
[tenant]
uri=nbd+unix:///tenant?socket=$dir/nbd.sock
[probe]
uri=nbd+unix:///probe?socket=$dir/nbd.sock
iodepth=1
JOB
echo "| build | rep | tenant IOPS | probe IOPS | probe p99 us | replies | loops / reply | pacer polls / reply | CPU us / reply |"
echo "|---|---|---|---|---|---|---|---|---|"
i=0
while [ $i -lt "$reps" ]; do
    for bin in "$@"; do
        flock "${LOCK:-/work/wt/bench.lock}" sh -c '
            bin=$1 cfg=$2 dir=$3
            rm -f "$dir/nbd.sock" "$dir/rpc.sock"
            "$bin" serve --config "$cfg" --tcp none --unix "$dir/nbd.sock" --rpc "$dir/rpc.sock" 2>"$dir/serve.log" &
            pid=$!
            while [ ! -S "$dir/rpc.sock" ]; do sleep 0.1; done
            t0=$(awk "{print \$14 + \$15}" /proc/$pid/stat)
            "$bin" stats --rpc "$dir/rpc.sock" --json >"$dir/s0.json"
            fio --output-format=json "$dir/job.fio" >"$dir/fio.json"
            t1=$(awk "{print \$14 + \$15}" /proc/$pid/stat)
            "$bin" stats --rpc "$dir/rpc.sock" --json >"$dir/s1.json"
            kill $pid
            wait $pid || true
            echo $((t1 - t0)) >"$dir/ticks"
        ' sh "$bin" "$cfg" "$dir"
        python3 - "$dir" "$(basename "$bin")" "$i" <<'PY'
import json, os, sys
d, name, rep = sys.argv[1:]
# Every reactor's counters, summed (26d read reactor 0 only).
def total(path):
    rs = json.load(open(path))["reactors"]
    return {
        "exports": [e for r in rs for e in r["exports"]],
        "loop_iterations": sum(r["loop_iterations"] for r in rs),
        "pacer": {"polls": sum(r["pacer"]["polls"] for r in rs)},
    }
s0 = total(d + "/s0.json")
s1 = total(d + "/s1.json")
text = open(d + "/fio.json").read()
f = json.loads(text[text.index("{"):])  # after fio's "connected" lines
jobs = {j["jobname"]: j["read"] for j in f["jobs"]}
replies = sum(e.get("ios", 0) for e in s1["exports"]) - sum(e.get("ios", 0) for e in s0["exports"])
loops = s1["loop_iterations"] - s0["loop_iterations"]
polls = s1["pacer"]["polls"] - s0["pacer"]["polls"]
ticks = int(open(d + "/ticks").read())
cpu_us = ticks / os.sysconf("SC_CLK_TCK") * 1e6
p99 = jobs["probe"]["clat_ns"]["percentile"]["99.000000"] / 1e3
print(f"| {name} | {int(rep) + 1} | {jobs['tenant']['iops']:,.0f} | {jobs['probe']['iops']:,.0f} | {p99:,.0f} | {replies:,} | {loops / replies:.2f} | {polls / replies:.2f} | {cpu_us / replies:.1f} |")
PY
    done
    i=$((i + 1))
done
rm -rf "$dir"
