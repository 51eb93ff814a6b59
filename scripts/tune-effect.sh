#!/bin/sh
# Issue 12's "tune, effect" on this machine's disk, end to end: probe the
# disk, tune it with the probe's cost model, then run
# scenarios/tune_effect.toml with that [cost.disk] and tune's isolation
# [qos.disk] (passed by --var; the scenario's [vars] are the last recorded
# ones, see docs/evidence.md#tune-effect-bank).
#
# Usage: scripts/tune-effect.sh OUT_DIR [more iopace bench args]
# Env:   BIN    the iopace binary (target/release/iopace)
#        IMG    the file probed and served (/var/tmp/iopace-probe.img)
#        LOCK   a lock file each timed step holds exclusively (flock), if set
#        FACTOR tune's --isolation-factor (2)
#        BUDGET tune's --budget (5m)
#        POLL   the reactor's poll mode, tuned and benched (adaptive)
# tune measures through `iopace serve` of tune-disk.toml (the scenario's
# [server] and [pacing]) and fio's nbd engine (--served), as the bench does.
set -eu
out=${1:?usage: scripts/tune-effect.sh OUT_DIR [bench args]}
shift
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/iopace}
IMG=${IMG:-/var/tmp/iopace-probe.img}
timed() {
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@"; else "$@"; fi
}
mkdir -p "$out"
# Written once, so no read hits a hole.
[ -f "$IMG" ] || dd if=/dev/urandom of="$IMG" bs=1M count=2048 oflag=direct
uptime
timed "$BIN" probe "$IMG" --destructive "$IMG" --threads 2 --out "$out/probe"
cost=$(sed 's/^\[cost\..*\]$/[cost.disk]/' "$out"/probe/cost-*.toml)
printf '[server]\nreactors = 1\npoll = "%s"\n\n[pacing]\nmode = "auto"\n\n[[bdev]]\nname = "disk"\nkind = "file"\npath = "%s"\n\n[[export]]\nname = "disk"\nbdev = "disk"\n\n%s\n' \
    "${POLL:-adaptive}" "$IMG" "$cost" >"$out/tune-disk.toml"
uptime
timed "$BIN" tune -c "$out/tune-disk.toml" disk --served --budget "${BUDGET:-5m}" \
    --isolation-factor "${FACTOR:-2}" --out "$out/tune"
qos=$(awk '/^# isolation solution/ { f = 1; next } f && /^```/ { exit } f' "$out/tune/report.md")
printf '%s\n\n%s\n' "$cost" "$qos" >"$out/applied.toml"
uptime
timed "$BIN" bench scenarios/tune_effect.toml --var "cost=$cost" --var "qos=$qos" \
    --var "poll=${POLL:-adaptive}" --out "$out/bench" "$@"
uptime
