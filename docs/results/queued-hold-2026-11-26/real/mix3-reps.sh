#!/bin/bash
# Copied from ../../lone-run-2026-11-26/mix3-reps.sh for the queued hold (1dd1117):
# mix3.sh (a copy of ../../lone-device-2026-11-26/mix3.sh, unchanged), a QD 1 4 KiB
# reader beside a 128 KiB QD 32 writer on the disk, mode auto, RUNTIME=8,
# on IMG (default: this check's 3 GiB image). before = 48610a5, after = 1dd1117,
# ref = main ff24bf7's code (iopace-main-4526576) in devtime's old place.
#   mix3-reps.sh REP...    each REP holds the bench lock once (~1 min)
# A rep: READER=ram then READER=disk; in each, before/after alternating by rep
# (odd: before first), ref (main ff24bf7's code) first in odd reps, last in even.
# Each output line is prefixed "rN <build>".
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MIX3=${MIX3:-$HERE/mix3.sh}
export IMG=${IMG:-/var/tmp/iopace-qhold31.img}
declare -A BIN=([before]=/work/wt/bin/iopace-yield-48610a5 [after]=/work/wt/bin/iopace-qhold-1dd1117
    [ref]=/work/wt/bin/iopace-main-4526576)
rep() {
    local n=$1 order
    if [ $((n % 2)) = 1 ]; then order="ref before after"; else order="after before ref"; fi
    for reader in ram disk; do
        for b in $order; do
            READER=$reader IOPACE=${BIN[$b]} RUNTIME=8 "$MIX3" auto | sed "s/^/r$n $b /"
        done
    done
}
if [ "${1:-}" = --locked ]; then rep "$2"; exit 0; fi
for n in "$@"; do
    date -u +"# rep $n start %H:%M:%S"
    flock /work/wt/bench.lock "$0" --locked "$n"
done
