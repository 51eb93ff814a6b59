#!/bin/bash
# Alternating A/B of two iopace builds on this machine's disk: the server and
# fio setup of ../queued-hold-2026-11-26/real/run.sh (one `iopace serve`,
# 1 reactor, one `file` export with O_DIRECT on /var/tmp, fio's nbd engine
# over a Unix socket, a fresh server each run, get_stats at the end of the
# ramp and 1 s before the end, the probe cost model), with its own image and
# sockets and these cases:
#   rd   one 128 KiB randread client at QD 32 (run.sh's `uni`)
#   wr   one 128 KiB randwrite client at QD 32
#   mix  4 KiB randread QD 32 + 128 KiB randread QD 8 (run.sh's `mix-probe`)
# all `auto`, plus rd under `none` on B (the third arm, for scale).
#
#   ab.sh OUT REP...        e.g. A=... B=... ab.sh /tmp/p32-out 1 2 3
#
# Each REP holds the bench lock once (7 runs, about 2.2 min). Builds
# alternate strictly: odd reps run A B | none | A B | A B, even reps
# B A | none | B A | B A, so in each case each build goes first in half the
# reps. The `none` run sits between the rd pair and the wr pair.
#
# With ARMS="label=binary ..." (added after the A/B, for the write
# follow-up), a rep instead runs each case in CASES (rd, wr or mix; `auto`)
# once per arm, the arms rotated by one per rep and reversed in even reps.
set -euo pipefail

OUT=${1:?out dir}
shift
A=${A:-/work/wt/bin/iopace-main-4526576}; AL=${AL:-ref}
B=${B:-/work/wt/bin/iopace-main-29ddf2a}; BL=${BL:-now}   # main 29ddf2a, built here
CASES=${CASES:-rd none wr mix}
IMG=${IMG:-/var/tmp/iopace-p32.img}   # 3 GiB, written once from /dev/urandom
RUNTIME=${RUNTIME:-15}
RAMP=${RAMP:-2}
LOCK=/work/wt/bench.lock
SOCK=/tmp/p32-iopace.sock
ADMIN=/tmp/p32-admin.sock
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

config() { # mode
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
$PROBE_COST
EOF
}

URI="nbd+unix:///disk?socket=$SOCK"
FIO_COMMON=(--ioengine=nbd "--uri=$URI" --time_based
    "--runtime=$RUNTIME" "--ramp_time=$RAMP" --lat_percentiles=1
    --percentile_list=50:99:99.9 --randrepeat=0 --output-format=json)

one() { # name bin mode workload(rd|wr|mix)
    local name=$1 bin=$2 mode=$3 wl=$4 d="$OUT/$1"
    mkdir -p "$d"
    config "$mode" > "$d/config.toml"
    "$bin" --version > "$d/version.txt"
    date -u +%H:%M:%S > "$d/start.txt"
    "$bin" serve -c "$d/config.toml" > "$d/server.log" 2>&1 &
    local srv=$!
    for _ in $(seq 50); do [ -S "$ADMIN" ] && grep -q 'iopace serving' "$d/server.log" && break; sleep 0.1; done
    local jobs
    case $wl in
        mix) jobs=(--rw=randread --name=small --bs=4k --iodepth=32 --name=large --bs=128k --iodepth=8) ;;
        rd)  jobs=(--rw=randread --name=uni --bs=128k --iodepth=32) ;;
        wr)  jobs=(--rw=randwrite --name=uni --bs=128k --iodepth=32) ;;
    esac
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

arms_rep() { # n
    local n=$1 c i arms=($ARMS) order=()
    local m=${#arms[@]}
    for ((i = 0; i < m; i++)); do order+=("${arms[$(( (i + n - 1) % m ))]}"); done
    if [ $((n % 2)) = 0 ]; then order=($(printf '%s\n' "${order[@]}" | tac)); fi
    for c in $CASES; do
        for x in "${order[@]}"; do one "r$n-$c-${x%%=*}" "${x#*=}" auto "$c"; done
    done
}

rep() { # n
    local n=$1 first second c
    if [ -n "${ARMS:-}" ]; then arms_rep "$n"; return; fi
    if [ $((n % 2)) = 1 ]; then first=A; second=B; else first=B; second=A; fi
    for c in $CASES; do
        if [ "$c" = none ]; then one "r$n-rd-none" "$B" none rd; continue; fi
        for x in $first $second; do
            if [ $x = A ]; then one "r$n-$c-$AL" "$A" auto "$c"; else one "r$n-$c-$BL" "$B" auto "$c"; fi
        done
    done
}

if [ "${1:-}" = --locked ]; then
    shift
    rep "$1"
    exit 0
fi
for n in "$@"; do
    echo "rep $n start $(date -u +%H:%M:%S) uptime: $(uptime)" >&2
    flock "$LOCK" "$0" "$OUT" --locked "$n"
    echo "rep $n end $(date -u +%H:%M:%S) uptime: $(uptime)" >&2
done
