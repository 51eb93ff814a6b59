#!/bin/sh
# How well `iopace tune` finds the bandwidth knee: a `model` bdev whose
# config cost model claims 80% of the device's rates (scripts/tune-knee.toml)
# stops gaining bandwidth at vrate 125%. Each rep runs `iopace tune` on it
# and reads the bandwidth solution's vrate from result.json; the summary
# gives each rep's vrate, its error against 125%, and whether it is within
# 10% (the goal of issue 12). A speed measurement: run it on a quiet
# machine, under the bench lock.
#
# Usage: scripts/tune-knee.sh OUT_DIR [REPS] [tune args]
# Env:   BIN   the iopace binary (target/release/iopace)
#        LOCK  a lock file each tune run holds exclusively (flock), if set
set -eu
out=${1:?usage: scripts/tune-knee.sh OUT_DIR [REPS] [tune args]}
reps=${2:-3}
shift; [ $# -gt 0 ] && shift
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/iopace}
CONFIG=$(dirname "$0")/tune-knee.toml
timed() {
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi
}
mkdir -p "$out"
echo "tune args: ${*:---quick}; $reps reps; $(uptime)"
printf '| rep | seconds | bandwidth solution vrate %% | error vs 125%% | within 10%% |\n|---|---|---|---|---|\n'
for rep in $(seq "$reps"); do
    start=$(date +%s)
    timed "$BIN" tune ${*:---quick} -c "$CONFIG" dev --out "$out/rep$rep" > "$out/rep$rep.log" 2>&1
    secs=$(( $(date +%s) - start ))
    python3 - "$out/rep$rep/result.json" "$rep" "$secs" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bw = next(s for s in r["solutions"] if s["name"] == "bandwidth")
v = bw["vrate"]
err = (v / 125.0 - 1.0) * 100
print(f"| {sys.argv[2]} | {sys.argv[3]} | {v:.1f} | {err:+.1f}% | {'yes' if abs(err) < 10 else 'no'} |")
PY
done
echo "$(uptime)"
