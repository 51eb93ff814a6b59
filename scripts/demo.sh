#!/usr/bin/env bash
# `make demo`: serves the embedded default config and runs a short fio job
# against each export over the Unix socket, then prints a table and the
# target's own statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${IOPACE_BIN:-target/release/iopace}
RUNTIME=${RUNTIME:-5}
work=$(mktemp -d /tmp/iopace-demo.XXXXXX)
sock=$work/nbd.sock
rpc=$work/admin.sock

"$BIN" serve --unix "$sock" --rpc "$rpc" --tcp 127.0.0.1:10809 2>"$work/serve.log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT INT TERM
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "demo: iopace did not start:"; cat "$work/serve.log"; exit 1; }
echo "iopace serve (pid $pid) listening on $sock and 127.0.0.1:10809; ${RUNTIME}s per job"

run() { # export rw bs qd
    local out="$work/$1-$2-$3-$4.json"
    fio --name="$1-$2" --ioengine=nbd --uri="nbd+unix:///$1?socket=$sock" \
        --rw="$2" --bs="$3" --iodepth="$4" --time_based --runtime="$RUNTIME" \
        --ramp_time=1 --output-format=json --output="$out" >/dev/null
    echo "$out"
}

results=()
for export in default null slow; do
    results+=("$(run "$export" randwrite 4k 32)")
    results+=("$(run "$export" randread 4k 32)")
    results+=("$(run "$export" randread 128k 8)")
done

python3 - "${results[@]}" <<'PY'
import json, sys
print()
print(f"| {'export':8} | {'job':18} | {'kIOPS':>7} | {'BW, MiB/s':>9} | {'AVG LAT, us':>11} | {'p99, us':>8} |")
print(f"|{'-'*10}|{'-'*20}|{'-'*9}|{'-'*11}|{'-'*13}|{'-'*10}|")
for path in sys.argv[1:]:
    job = json.load(open(path))["jobs"][0]
    name = path.rsplit("/", 1)[1][:-5].split("-")
    export, rw, bs, qd = name[0], name[1], name[2], name[3]
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    clat = side["clat_ns"]
    p99 = clat.get("percentile", {}).get("99.000000", 0) / 1000
    print(f"| {export:8} | {rw+' '+bs+' QD'+qd:18} | {side['iops']/1000:7.1f} | {side['bw']/1024:9.1f} | "
          f"{side['lat_ns']['mean']/1000:11.1f} | {p99:8.1f} |")
PY
echo
"$BIN" stats --rpc "$rpc"
