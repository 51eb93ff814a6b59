#!/bin/sh
# How close `iopace probe` comes to a `model` bdev's ground truth, and how
# fast: the goal of issue 35 is all six iocost parameters within 10% of the
# truth, for devices of any shape, within 2 minutes. Each rep probes each
# shape of scripts/probe-accuracy.toml (one at a time: the fast shape needs
# the CPU) and compares result.json's cost model with the shape's; the
# summary gives each run's seconds from result.json (`elapsed_s`, the whole
# probe, and `cost_s`, the searches and rounds up to the cost model; not
# the wall time, which includes waiting for the lock), where they went
# (`phases`: the peak searches, the rounds and how many, the QD curves and
# the thread scaling), its worst parameter and error, and whether it meets
# the goal. A speed measurement: run it under the
# bench lock, on a quiet machine if you can, and say the load (it prints
# `uptime`). The search and fit alone are checked exactly, in virtual time,
# by crates/probe/src/run_model_tests.rs.
#
# Usage: scripts/probe-accuracy.sh OUT_DIR [REPS] [SHAPE...]
# Env:   BIN         the iopace binary (target/release/iopace)
#        LOCK        a lock file each probe run holds exclusively (flock), if set
#        PROBE_ARGS  the probe's mode (default --quick; "" for the full probe)
set -eu
out=${1:?usage: scripts/probe-accuracy.sh OUT_DIR [REPS] [SHAPE...]}
reps=${2:-3}
shift; [ $# -gt 0 ] && shift
shapes=${*:-knee few slow fast}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/iopace}
CONFIG=$(dirname "$0")/probe-accuracy.toml
mode=${PROBE_ARGS---quick}
timed() {
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi
}
mkdir -p "$out"
echo "probe ${mode:-(full)} --max-qd 64 --threads 1; $reps reps; $(uptime)"
printf '| shape | rep | probe s | cost model s | searches s | rounds s (rounds) | curves s | scaling s | worst parameter | its error | all six within 10%% | within 2 min |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for rep in $(seq "$reps"); do
    for shape in $shapes; do
        dir="$out/$shape-rep$rep"
        # shellcheck disable=SC2086 # $mode is zero or more flags
        timed "$BIN" probe $mode --max-qd 64 --threads 1 -c "$CONFIG" "$shape" \
            --out "$dir" > "$dir.log" 2>&1
        python3 - "$CONFIG" "$dir/result.json" "$shape" "$rep" <<'PY'
import json, sys, tomllib
config, result, shape, rep = sys.argv[1:]
truth = next(b["cost"] for b in tomllib.load(open(config, "rb"))["bdev"] if b["name"] == shape)
dev = json.load(open(result))["devices"][0]
err = {k: dev["cost"][k] / float(v) - 1.0 for k, v in truth.items()}
worst = max(err, key=lambda k: abs(err[k]))
ok = all(abs(e) < 0.10 for e in err.values())
fast = dev["elapsed_s"] <= 120
ph = dev.get("phases") or {}
p = lambda k: f"{ph[k]:.1f}" if k in ph else "-"
print(f"| {shape} | {rep} | {dev['elapsed_s']:.0f} | {dev['cost_s']:.1f} | {p('search_s')} | "
      f"{p('rounds_s')} ({ph.get('rounds', len(dev['round_iops'][0][1]))}) | {p('curves_s')} | "
      f"{p('scaling_s')} | {worst} | {err[worst] * 100:+.1f}% | {'yes' if ok else 'no'} | "
      f"{'yes' if fast else 'no'} |")
PY
    done
done
echo "$(uptime)"
