#!/bin/bash
# ../lone-device-2026-11-26/mix3.sh (unchanged) for the lone-run rule: a QD 1 4 KiB
# reader beside a 128 KiB QD 32 writer on the disk, mode auto, RUNTIME=8.
#   mix3-reps.sh REP...    each REP holds the bench lock once (~1 min)
# A rep: READER=ram then READER=disk; in each, before/after alternating by rep
# (odd: before first), devtime (main bbc2f0c) first in odd reps, last in even.
# Each output line is prefixed "rN <build>".
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MIX3=${MIX3:-$HERE/../lone-device-2026-11-26/mix3.sh}   # MIX3=$HERE/mix3-poll.sh: the same with the held poll
declare -A BIN=([before]=/work/wt/bin/iopace-flowsamples [after]=/work/wt/bin/iopace-lonerun
    [devtime]=/work/wt/bin/iopace-devtime)
rep() {
    local n=$1 order
    if [ $((n % 2)) = 1 ]; then order="devtime before after"; else order="after before devtime"; fi
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
