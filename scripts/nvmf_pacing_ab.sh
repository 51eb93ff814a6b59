#!/usr/bin/env bash
# NVMe/TCP 128 KiB QD 16 reads from one spdk_nvme_perf host against iopace
# with different `[pacing]` tables, alternating (order flipped each rep), to
# compare pacing modes in one run (issue 37). Each run: a fresh iopace on
# core 0 (1 reactor, 1 GiB malloc bdev, filled once with 128 KiB writes),
# perf on core 1, loopback; `iopace rpc get_stats` is saved halfway through
# each read (the pacer's window, in flight, queued).
#
#   flock /work/wt/bench.lock scripts/nvmf_pacing_ab.sh OUT SPEC...
#   SPEC: a pacing mode, "+key=value" lines to add to [pacing], and
#         ":BIN" for another binary: auto none auto+gain=8.0 auto:/tmp/old
#   REPS (default 3), RUNTIME (s, default 8); prints OUT/results.tsv.
#
# Does not take the bench lock itself: run it under flock.
set -uo pipefail
. "$(dirname "$0")/nvmf_config.sh"
OUT=$1; shift
SPDK=${SPDK_DIR:-$HOME/.cache/iopace-spdk-v26.05}
export LD_LIBRARY_PATH=$SPDK/build/lib
REPS=${REPS:-3}; RUNTIME=${RUNTIME:-8}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/iopace}
PORT=4431; NQN=nqn.2026-11.io.iopace:default
mkdir -p "$OUT"; WORK=$(mktemp -d /tmp/nvmf-pacing.XXXXXX)
printf 'mode\trep\tiops\tmibs\tavg_us\n' > "$OUT/results.tsv"
for rep in $(seq $REPS); do
  order="$*"; [ $((rep % 2)) = 0 ] && order=$(echo "$*" | tr ' ' '\n' | tac | tr '\n' ' ')
  for spec in $order; do
    full=${spec%%:*}; bin=$BIN; [ "$spec" != "$full" ] && bin=${spec#*:}; mode=${full%%+*}; extra=""; [ "$full" != "$mode" ] && extra=$(echo "${full#*+}" | tr "+" "\n")
    tag=$(echo "$spec" | tr '/:' '__')
    nvmf_config adaptive "$WORK/rpc.sock" "$PORT" "$(printf '[pacing]\nmode = "%s"\n%s' "$mode" "$extra")" > "$WORK/c.toml"
    taskset -c 0 "$bin" serve --config "$WORK/c.toml" > "$OUT/srv-$tag-$rep.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    R="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
    "$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 512 -i 8 -c 0x2 -q 16 -o 131072 -w write -t 3 -r "$R" > /dev/null 2>&1
    log="$OUT/perf-$tag-$rep.txt"
    ( sleep $((RUNTIME/2)); "$bin" rpc get_stats --rpc "$WORK/rpc.sock" > "$OUT/stats-$tag-$rep.json" 2>&1 ) &
    sp=$!
    "$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 512 -i 8 -c 0x2 -q 16 -o 131072 -w read -t $RUNTIME -r "$R" > "$log" 2>&1
    wait $sp
    kill $pid; wait $pid 2>/dev/null
    grep '^Total' "$log" | tail -1 | awk -v m="$tag" -v r="$rep" -F: '{split($2,f," "); printf "%s\t%s\t%s\t%s\t%s\n", m, r, f[1], f[2], f[3]}' >> "$OUT/results.tsv"
  done
done
rm -rf "$WORK"
cat "$OUT/results.tsv"
