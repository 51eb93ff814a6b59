#!/bin/sh
# A/B of two iopace binaries, alternating: each round starts one, runs fio
# 4 KiB random reads at QD 32 over a Unix socket against a RAM export, and
# prints its IOPS. Rounds go A B A B ..., so drift of a shared machine hits
# both alike. Take the bench lock for the whole run:
#   flock /work/wt/bench.lock scripts/ab.sh A_BINARY B_BINARY [ROUNDS] [SECONDS]
set -eu
A=$1; B=$2; ROUNDS=${3:-5}; SECS=${4:-10}
WORK=$(mktemp -d /tmp/iopace-ab.XXXXXX)
cat > "$WORK/c.toml" <<TOML
[server]
reactors = 1
tcp = []
unix = ["$WORK/nbd.sock"]
rpc = "$WORK/admin.sock"
[[bdev]]
name = "ram"
kind = "malloc"
size = "1GiB"
[[export]]
name = "default"
bdev = "ram"
TOML
run() {
  "$1" serve --config "$WORK/c.toml" 2> "$WORK/log" &
  pid=$!
  for _ in $(seq 100); do [ -S "$WORK/admin.sock" ] && break; sleep 0.1; done
  # Non-zero data first, then the timed reads.
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///default?socket=$WORK/nbd.sock" \
    --rw=write --bs=1M --size=256M --iodepth=4 > /dev/null
  fio --name=r --ioengine=nbd --uri="nbd+unix:///default?socket=$WORK/nbd.sock" \
    --rw=randread --bs=4k --size=256M --iodepth=32 --time_based --runtime="$SECS" \
    --output-format=json | sed -n '/^{/,$p' |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
  kill -TERM $pid; wait $pid || true
  rm -f "$WORK/admin.sock" "$WORK/nbd.sock"
}
for r in $(seq "$ROUNDS"); do
  echo "round $r A $(run "$A")"
  echo "round $r B $(run "$B")"
done
rm -rf "$WORK"
