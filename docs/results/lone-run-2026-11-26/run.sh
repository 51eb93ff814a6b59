#!/bin/bash
# Lone-run rule (b912e56) on the real target: ../device-time-2026-11-26/real/run.sh's
# mixed runs (auto, probe cost model only) with diag.sh's get_stats poll (every
# 0.25 s) in every run, so each run gives fio's figures AND the share of polls
# with the device held at depth 1 (the lone-client hold).
#
#   run.sh OUT REP...      each REP holds the bench lock once (~1.5 min)
#
# A rep, builds alternating (odd reps before first, even reps after first):
#   rN-mix-{before,after}     4 KiB randread QD 32 + 128 KiB randread QD 8, auto, probe model
#   rN-mix-devtime            the same on main bbc2f0c (devtime), first in odd reps, last in even
#   rN-mix-none               mode none, on the build that went first of before/after
# Fresh server each run; RAMP s ramp then RUNTIME s measured; stats0/stats1
# at ramp end and 1 s before fio ends (as run.sh), poll.jsonl through the run.
set -euo pipefail
OUT=${1:?out dir}
shift
BEFORE=${BEFORE:-/work/wt/bin/iopace-flowsamples}
AFTER=${AFTER:-/work/wt/bin/iopace-lonerun}
DEVTIME=${DEVTIME:-/work/wt/bin/iopace-devtime}
IMG=${IMG:-/var/tmp/iopace-lonerun30.img}   # 3 GiB, written once from /dev/urandom
RUNTIME=${RUNTIME:-15}
RAMP=${RAMP:-2}
LOCK=/work/wt/bench.lock
SOCK=/tmp/p30-iopace.sock
ADMIN=/tmp/p30-admin.sock
mkdir -p "$OUT"
[ -f "$IMG" ] || { echo "no $IMG: dd if=/dev/urandom of=$IMG bs=1M count=3072 oflag=direct" >&2; exit 1; }

config() { # mode
    cat <<EOT
[server]
reactors = 1
tcp = []
unix = ["$SOCK"]
rpc = "$ADMIN"

[[bdev]]
name = "disk"
kind = "file"
path = "$IMG"
size = "3GiB"
direct = "on"

[[export]]
name = "disk"
bdev = "disk"

[pacing]
mode = "$1"

[cost.disk]
rbps = 669679286
rseqiops = 335613
rrandiops = 65123
wbps = 1324131295
wseqiops = 366752
wrandiops = 58981
EOT
}

one() { # name bin mode
    local name=$1 bin=$2 mode=$3 d="$OUT/$1"
    mkdir -p "$d"
    config "$mode" > "$d/config.toml"
    "$bin" --version > "$d/version.txt"
    "$bin" serve -c "$d/config.toml" > "$d/server.log" 2>&1 &
    local srv=$!
    for _ in $(seq 50); do [ -S "$ADMIN" ] && grep -q 'iopace serving' "$d/server.log" && break; sleep 0.1; done
    fio --ioengine=nbd "--uri=nbd+unix:///disk?socket=$SOCK" --rw=randread --time_based \
        "--runtime=$RUNTIME" "--ramp_time=$RAMP" --lat_percentiles=1 \
        --percentile_list=50:99:99.9 --randrepeat=0 --output-format=json \
        --name=small --bs=4k --iodepth=32 --name=large --bs=128k --iodepth=8 \
        "--output=$d/fio.json" > "$d/fio.out" 2>&1 &
    local fio=$!
    : > "$d/poll.jsonl"
    local t0=$SECONDS took0=0 took1=0
    while kill -0 "$fio" 2>/dev/null; do
        local el=$((SECONDS - t0))
        if [ $took0 = 0 ] && [ $el -ge "$RAMP" ]; then
            "$bin" rpc get_stats --rpc "$ADMIN" > "$d/stats0.json"; took0=1
        elif [ $took1 = 0 ] && [ $el -ge $((RAMP + RUNTIME - 1)) ]; then
            "$bin" rpc get_stats --rpc "$ADMIN" > "$d/stats1.json"; took1=1
        fi
        # diag.sh's poll, with jq instead of python (cheaper on 2 CPUs); only after the ramp
        if [ $el -ge "$RAMP" ]; then
            "$bin" rpc get_stats --rpc "$ADMIN" 2>/dev/null | jq -c '.reactors[0] as $r | {uptime_s: $r.uptime_s,
                held_devices: $r.pacer.held_devices, window_bytes: $r.pacer.window_bytes,
                bytes_in_flight: $r.pacer.bytes_in_flight, queued: $r.pacer.queued,
                depth: $r.pacer.depth, depth_in_effect: $r.pacer.depth_in_effect,
                buffers_in_use: $r.buffers.in_use}' >> "$d/poll.jsonl" || true
        fi
        sleep 0.25
    done
    wait "$fio"
    kill -TERM "$srv"
    wait "$srv" || echo "server $name exited $?" >&2
    echo "$name done" >&2
}

rep() { # n
    local n=$1 a b
    if [ $((n % 2)) = 1 ]; then a=before; b=after; else a=after; b=before; fi
    bin() { [ "$1" = before ] && echo "$BEFORE" || echo "$AFTER"; }
    [ $((n % 2)) = 1 ] && one "r$n-mix-devtime" "$DEVTIME" auto
    for x in $a $b; do one "r$n-mix-$x" "$(bin $x)" auto; done
    one "r$n-mix-none" "$(bin $a)" none
    [ $((n % 2)) = 0 ] && one "r$n-mix-devtime" "$DEVTIME" auto
    true
}

if [ "${1:-}" = --locked ]; then
    rep "$2"
    exit 0
fi
for n in "$@"; do
    date -u +"rep $n start %H:%M:%S" >&2
    flock "$LOCK" "$0" "$OUT" --locked "$n"
done
