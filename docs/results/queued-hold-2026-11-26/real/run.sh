#!/bin/bash
# Queued hold (1dd1117) on the real target: a copy of
# ../../device-time-2026-11-26/real/run.sh with BEFORE = 48610a5 (main before
# the change), AFTER = 1dd1117, its own image and sockets, and one extra run
# a rep: mix-probe-ref on REF (main ff24bf7's code, before e1ba1ae and
# 48610a5 too), first in odd reps and last in even ones.
# Otherwise unchanged: one `iopace serve` (1 reactor) with one `file` export
# (O_DIRECT) on /var/tmp, fio's nbd engine over a Unix socket.
#
#   run.sh OUT REP...      e.g. run.sh /tmp/devtime-real 1 2 3
#
# Each REP holds the bench lock once (about 2.5 min) and makes, in an order
# that alternates builds (odd reps before first, even reps after first):
#   mix-probe-{before,after}    4 KiB randread QD 32 + 128 KiB randread QD 8, auto, probe cost model
#   mix-default-{before,after}  the same, auto, no [cost] (the file kind's default: NVMe)
#   mix-none-{before|after}     the same, mode none (one build a rep, alternating)
#   uni-{before,after}          128 KiB randread QD 32 alone, auto, probe cost model
#   mix-probe-ref               mix-probe on REF (odd reps first, even reps last)
# UNI_QD sets the uniform job's depth (default 32; ../qd256/ ran 256).
# With SET=uni (added after the first 3 reps, for the uniform case alone), a rep is
#   uni-ref (odd reps first), uni-{before,after} alternating, uni-none (on the
#   build that went first), uni-ref (even reps last).
# Every run starts a fresh server; RUNTIME s measured after RAMP s of ramp.
# Server stats (get_stats) are taken at the end of the ramp and just before
# fio ends; summarize.py turns the time-averaged counters into the
# averages over that interval.
set -euo pipefail

OUT=${1:?out dir}
shift   # then REP..., or --locked REP (one rep, the lock already held)
BEFORE=${BEFORE:-/work/wt/bin/iopace-yield-48610a5}
AFTER=${AFTER:-/work/wt/bin/iopace-qhold-1dd1117}
REF=${REF:-/work/wt/bin/iopace-main-4526576}   # code of main ff24bf7; REF= (empty) skips it
IMG=${IMG:-/var/tmp/iopace-qhold31.img}   # 3 GiB, written once from /dev/urandom
RUNTIME=${RUNTIME:-15}
RAMP=${RAMP:-2}
LOCK=/work/wt/bench.lock
SOCK=/tmp/p31-iopace.sock
ADMIN=/tmp/p31-admin.sock
mkdir -p "$OUT"

[ -f "$IMG" ] || { echo "no $IMG: dd if=/dev/urandom of=$IMG bs=1M count=3072 oflag=direct" >&2; exit 1; }

# The probe's run 1 of this disk (docs/results/probe-disk-2026-11-23/run1).
PROBE_COST='[cost.disk]
rbps = 669679286
rseqiops = 335613
rrandiops = 65123
wbps = 1324131295
wseqiops = 366752
wrandiops = 58981'

config() { # mode cost(probe|default)
    cat <<EOF
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
EOF
    [ "$2" = probe ] && echo "$PROBE_COST"
    true
}

URI="nbd+unix:///disk?socket=$SOCK"
FIO_COMMON=(--ioengine=nbd "--uri=$URI" --rw=randread --time_based
    "--runtime=$RUNTIME" "--ramp_time=$RAMP" --lat_percentiles=1
    --percentile_list=50:99:99.9 --randrepeat=0 --output-format=json)

one() { # name bin mode cost workload(mix|uni)
    local name=$1 bin=$2 mode=$3 cost=$4 wl=$5 d="$OUT/$1"
    mkdir -p "$d"
    config "$mode" "$cost" > "$d/config.toml"
    "$bin" --version > "$d/version.txt"
    "$bin" serve -c "$d/config.toml" > "$d/server.log" 2>&1 &
    local srv=$!
    for _ in $(seq 50); do [ -S "$ADMIN" ] && grep -q 'iopace serving' "$d/server.log" && break; sleep 0.1; done
    local jobs
    if [ "$wl" = mix ]; then
        jobs=(--name=small --bs=4k --iodepth=32 --name=large --bs=128k --iodepth=8)
    else
        jobs=(--name=uni --bs=128k --iodepth=${UNI_QD:-32})
    fi
    fio "${FIO_COMMON[@]}" "${jobs[@]}" "--output=$d/fio.json" > "$d/fio.out" 2>&1 &
    local fio=$!
    sleep "$RAMP"
    "$bin" rpc get_stats --rpc "$ADMIN" > "$d/stats0.json"
    sleep $((RUNTIME - 1))
    "$bin" rpc get_stats --rpc "$ADMIN" > "$d/stats1.json"
    wait "$fio"
    kill -TERM "$srv"
    wait "$srv" || echo "server $name exited $?" >&2
    echo "$name done" >&2
}

rep() { # n
    local n=$1 a b
    if [ $((n % 2)) = 1 ]; then a=before; b=after; else a=after; b=before; fi
    bin() { [ "$1" = before ] && echo "$BEFORE" || echo "$AFTER"; }
    if [ "${SET:-all}" = uni ]; then
        [ -n "$REF" ] && [ $((n % 2)) = 1 ] && one "r$n-uni-ref" "$REF" auto probe uni
        for x in $a $b; do one "r$n-uni-$x" "$(bin $x)" auto probe uni; done
        one "r$n-uni-none-$a" "$(bin $a)" none probe uni
        [ -n "$REF" ] && [ $((n % 2)) = 0 ] && one "r$n-uni-ref" "$REF" auto probe uni
        return 0
    fi
    [ -n "$REF" ] && [ $((n % 2)) = 1 ] && one "r$n-mix-probe-ref" "$REF" auto probe mix
    for x in $a $b; do one "r$n-mix-probe-$x" "$(bin $x)" auto probe mix; done
    for x in $b $a; do one "r$n-mix-default-$x" "$(bin $x)" auto default mix; done
    one "r$n-mix-none-$a" "$(bin $a)" none probe mix
    for x in $a $b; do one "r$n-uni-$x" "$(bin $x)" auto probe uni; done
    [ -n "$REF" ] && [ $((n % 2)) = 0 ] && one "r$n-mix-probe-ref" "$REF" auto probe mix
    true
}

if [ "${1:-}" = --locked ]; then
    shift
    rep "$1"
    exit 0
fi
for n in "$@"; do
    date -u +"rep $n start %H:%M:%S" >&2
    flock "$LOCK" "$0" "$OUT" --locked "$n"
done
