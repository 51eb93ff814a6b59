#!/bin/sh
# The disk alone, no iopace: a 4 KiB random-read QD 1 probe beside a
# random-read tenant held to a queue depth or a rate (fio's own io_uring
# engine, O_DIRECT on the file). Bounds what any scheduler in front of this
# disk can give: it can hold the tenant to a depth or a rate, not reorder
# the disk's queue.
# Usage: device_alone.sh [FILE] [LOCK]   (prints one line per point)
f=${1:-/var/tmp/iopace-probe.img}
lock=${2:-}
timed() { if [ -n "$lock" ]; then flock "$lock" "$@"; else "$@"; fi; }
show() {
    python3 - "$1" "$2" <<'PY'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
def pct(j, p): return j["clat_ns"]["percentile"][p] / 1000
if len(jobs) == 1:
    p = jobs[0]["read"]
    print(f"{sys.argv[2]:<34} {'':>16} probe {p['iops']:>7.0f} IOPS p50 {pct(p,'50.000000'):>6.0f} p99 {pct(p,'99.000000'):>6.0f} us")
else:
    t, p = jobs[0]["read"], jobs[1]["read"]
    print(f"{sys.argv[2]:<34} tenant {t['bw_bytes']/2**20:>5.0f} MiB/s {t['iops']:>7.0f} IOPS probe p50 {pct(p,'50.000000'):>6.0f} p99 {pct(p,'99.000000'):>6.0f} us")
PY
}
common="--filename=$f --direct=1 --ioengine=io_uring --runtime=6 --time_based --output-format=json"
out=$(mktemp)
timed fio $common --name=probe --rw=randread --bs=4k --iodepth=1 >"$out" 2>/dev/null
show "$out" "probe alone"
for point in "4k 64" "4k 32" "4k 16" "4k 8" "4k 4" "4k 64 --rate_iops=80000" "4k 64 --rate_iops=70000" "4k 64 --rate_iops=60000" \
    "16k 64" "16k 16" "16k 8" "16k 4" "128k 32" "128k 8" "128k 4" "128k 2" "128k 32 --rate=950m" "128k 32 --rate=800m"; do
    set -- $point
    timed fio $common --name=tenant --rw=randread --bs="$1" --iodepth="$2" $3 \
        --name=probe --rw=randread --bs=4k --iodepth=1 >"$out" 2>/dev/null
    show "$out" "tenant $1 QD $2 ${3:-}"
done
rm -f "$out"
