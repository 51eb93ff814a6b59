#!/bin/sh
# Time runnable but waiting for a core (/proc/PID/task/*/schedstat, field
# 2) of the server's threads and each fio process, over 6 s of the
# workload of loops.sh (tenant QD 64, probe QD 1), per IO of that
# process's job: how much of the probe's latency is waiting for a CPU.
# Usage: rundelay.sh CONFIG BIN (holds LOCK)
set -eu
cfg=$1 bin=$2
dir=$(mktemp -d /tmp/iopace-rq-XXXXXX)
cat >"$dir/job.fio" <<JOB
[global]
ioengine=nbd
time_based
rw=randread
bs=4k
iodepth=64
runtime=10
size=2g
[tenant]
uri=nbd+unix:///tenant?socket=$dir/nbd.sock
[probe]
uri=nbd+unix:///probe?socket=$dir/nbd.sock
iodepth=1
JOB
flock "${LOCK:-/work/wt/bench.lock}" sh -c '
    bin=$1 cfg=$2 dir=$3
    "$bin" serve --config "$cfg" --tcp none --unix "$dir/nbd.sock" --rpc "$dir/rpc.sock" 2>"$dir/serve.log" &
    pid=$!
    while [ ! -S "$dir/rpc.sock" ]; do sleep 0.1; done
    fio --output-format=json "$dir/job.fio" >"$dir/fio.json" &
    fp=$!
    sleep 3
    snap() {
        for t in /proc/$pid/task/*; do echo "server $(cut -d" " -f2 $t/schedstat)"; done
        for c in $(pgrep -P $fp) $fp; do
            echo "fio:$c $(cat /proc/$c/comm) $(cut -d" " -f2 /proc/$c/schedstat)"
        done
    }
    snap >"$dir/a"
    sleep 6
    snap >"$dir/b"
    wait $fp
    kill $pid
    wait $pid || true
' sh "$bin" "$cfg" "$dir"
python3 - "$dir" "$(basename "$cfg")" <<'PY'
import json, sys
d, name = sys.argv[1:]
def read(p):
    out = {}
    for line in open(p):
        parts = line.split()
        key = " ".join(parts[:-1])
        out[key] = out.get(key, 0) + int(parts[-1])
    return out
a, b = read(d + "/a"), read(d + "/b")
t = open(d + "/fio.json").read()
f = json.loads(t[t.index("{"):])
jobs = {j["jobname"]: j["read"] for j in f["jobs"]}
row = [name]
for k in sorted(b):
    row.append(f"{k}: {(b[k] - a.get(k, 0)) / 6e6:.0f} ms/s waiting")
p = jobs["probe"]
row.append(f"tenant {jobs['tenant']['iops']:,.0f} IOPS; probe p50 {p['clat_ns']['percentile']['50.000000']/1e3:.0f} p99 {p['clat_ns']['percentile']['99.000000']/1e3:.0f} us")
print(" | ".join(row))
PY
rm -rf "$dir"
