#!/bin/bash
# What bounds `auto` in run.sh's mixed runs: get_stats every 0.25 s during
# one run, for the pacer's held devices (the lone-client depth-1 hold),
# window, bytes in flight and queue.
#
#   diag.sh OUT     (takes the bench lock once, about 1.5 min)
#
# Runs (auto, probe cost model, 1 reactor, RUNTIME s each):
#   mix-{before,after}   4 KiB QD 32 + 128 KiB QD 8, as run.sh
#   small-after          4 KiB QD 32 alone
#   large-after          128 KiB QD 8 alone
# ONLY="small-after" runs only the runs named; FIO_PREFIX="nice -n -10"
# puts that before fio (is the hold fio being descheduled?).
set -euo pipefail
OUT=${1:?out dir}
BEFORE=${BEFORE:-/work/wt/bin/iopace-ea3a642}
AFTER=${AFTER:-/work/wt/bin/iopace-devtime}
IMG=${IMG:-/var/tmp/iopace-devtime29.img}
RUNTIME=${RUNTIME:-12}
ONLY=${ONLY:-mix-before mix-after small-after large-after}
FIO_PREFIX=${FIO_PREFIX:-}
SOCK=/tmp/p29-iopace.sock
ADMIN=/tmp/p29-admin.sock

if [ "${2:-}" != --locked ]; then
    exec flock /work/wt/bench.lock "$0" "$OUT" --locked
fi
mkdir -p "$OUT"

one() { # name bin fio-jobs...
    local name=$1 bin=$2 d="$OUT/$1"
    case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
    shift 2
    mkdir -p "$d"
    # run.sh's config: mode auto, the probe's cost model
    cat > "$d/config.toml" <<EOF
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
mode = "auto"

[cost.disk]
rbps = 669679286
rseqiops = 335613
rrandiops = 65123
wbps = 1324131295
wseqiops = 366752
wrandiops = 58981
EOF
    "$bin" serve -c "$d/config.toml" > "$d/server.log" 2>&1 &
    local srv=$!
    for _ in $(seq 50); do [ -S "$ADMIN" ] && grep -q 'iopace serving' "$d/server.log" && break; sleep 0.1; done
    $FIO_PREFIX fio --ioengine=nbd "--uri=nbd+unix:///disk?socket=$SOCK" --rw=randread --time_based \
        "--runtime=$RUNTIME" --randrepeat=0 --output-format=json "--output=$d/fio.json" "$@" \
        > "$d/fio.out" 2>&1 &
    local fio=$!
    sleep 2
    : > "$d/poll.jsonl"
    while kill -0 "$fio" 2>/dev/null; do
        "$bin" rpc get_stats --rpc "$ADMIN" 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)["reactors"][0]
p = r["pacer"]
print(json.dumps({"uptime_s": r["uptime_s"], "held_devices": p["held_devices"],
    "window_bytes": p["window_bytes"], "bytes_in_flight": p["bytes_in_flight"],
    "queued": p["queued"], "depth": p["depth"], "depth_in_effect": p["depth_in_effect"],
    "buffers_in_use": r["buffers"]["in_use"]}))' >> "$d/poll.jsonl" || true
        sleep 0.25
    done
    wait "$fio" || true
    kill -TERM "$srv"
    wait "$srv" || true
    echo "$name done" >&2
}

MIX=(--name=small --bs=4k --iodepth=32 --name=large --bs=128k --iodepth=8)
one mix-before "$BEFORE" "${MIX[@]}"
one mix-after "$AFTER" "${MIX[@]}"
one small-after "$AFTER" --name=small --bs=4k --iodepth=32
one large-after "$AFTER" --name=large --bs=128k --iodepth=8

# One line a run: the share of polls with the device held at depth 1, the
# pacer's window, bytes in flight, queue and depth (means over the polls).
for name in $ONLY; do
    python3 - "$OUT/$name" <<'PYEOF'
import json, os, statistics, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(d, "poll.jsonl")) if l.strip()]
m = lambda k: statistics.mean(r[k] for r in rows)
t = open(os.path.join(d, "fio.json")).read()
f = json.loads(t[t.index("{"):])
jobs = " ".join(f"{j['jobname']} {j['read']['iops']:.0f} IOPS {j['read']['bw_bytes'] / 2**20:.0f} MiB/s" for j in f["jobs"])
print(f"{os.path.basename(d):12s} polls {len(rows)} held {m('held_devices'):.2f} window {m('window_bytes') / 2**20:.2f} MiB "
      f"in flight {m('bytes_in_flight') / 2**20:.2f} MiB queued {m('queued'):.1f} depth {m('depth_in_effect'):.2f} "
      f"buffers {m('buffers_in_use'):.1f} | {jobs}")
PYEOF
done
