#!/bin/bash
# Is the lone-client hold fio's nbd engine? The same poll as diag.sh, with
# `qemu-img bench` (QEMU's own NBD client) reading 4 KiB at depth 32
# instead of fio, on the after build (auto, probe cost model, 1 reactor).
# Offsets stride by 257 x 4 KiB through the image, wrapping: not random,
# but scattered over the 3 GiB.
#
#   diag-qemu.sh OUT    (takes the bench lock once, ~20 s)
set -euo pipefail
OUT=${1:?out dir}
BIN=${AFTER:-/work/wt/bin/iopace-devtime}
IMG=${IMG:-/var/tmp/iopace-devtime29.img}
COUNT=${COUNT:-600000}
SOCK=/tmp/p29-iopace.sock
ADMIN=/tmp/p29-admin.sock
if [ "${2:-}" != --locked ]; then
    exec flock /work/wt/bench.lock "$0" "$OUT" --locked
fi
d="$OUT/qemu-small-after"
mkdir -p "$d"
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
"$BIN" serve -c "$d/config.toml" > "$d/server.log" 2>&1 &
srv=$!
for _ in $(seq 50); do [ -S "$ADMIN" ] && grep -q 'iopace serving' "$d/server.log" && break; sleep 0.1; done
qemu-img bench -f raw -c "$COUNT" -d 32 -s 4096 -S $((257 * 4096)) \
    "nbd+unix:///disk?socket=$SOCK" > "$d/bench.out" 2>&1 &
q=$!
sleep 2
: > "$d/poll.jsonl"
while kill -0 "$q" 2>/dev/null; do
    "$BIN" rpc get_stats --rpc "$ADMIN" 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)["reactors"][0]
p = r["pacer"]
e = r["exports"][0]
print(json.dumps({"held_devices": p["held_devices"], "bytes_in_flight": p["bytes_in_flight"],
    "queued": p["queued"], "depth_in_effect": p["depth_in_effect"], "ios": e["ios"], "uptime_s": r["uptime_s"]}))' >> "$d/poll.jsonl" || true
    sleep 0.25
done
wait "$q" || true
kill -TERM "$srv"
wait "$srv" || true
python3 - "$d" <<'PYEOF'
import json, os, statistics, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(d, "poll.jsonl")) if l.strip()]
m = lambda k: statistics.mean(r[k] for r in rows)
iops = (rows[-1]["ios"] - rows[0]["ios"]) / (rows[-1]["uptime_s"] - rows[0]["uptime_s"])
print(f"qemu-small-after polls {len(rows)} held {m('held_devices'):.2f} in flight {m('bytes_in_flight') / 2**20:.2f} MiB "
      f"queued {m('queued'):.1f} depth {m('depth_in_effect'):.2f} | {iops:.0f} IOPS (server count)")
PYEOF
tail -2 "$d/bench.out"
