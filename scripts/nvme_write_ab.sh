#!/usr/bin/env bash
# NVMe/TCP writes, two iopace binaries A/B: each serves alone on core 0
# (1 reactor, a 1 GiB RAM disk), spdk_nvme_perf on core 1, loopback.
# Binaries alternate (order flipped each rep); REPS reps (default 3) of
# RUNTIME s (default 8) per workload: 128 KiB sequential writes at QD 16,
# without and with header and data digests (-H -I), and 4 KiB random
# writes at QD 32. Each run records MiB/s, the target's CPU time per GiB
# written, and the share of the bytes it received straight into request
# buffers (`bytes_in_direct` of `get_stats`, 0 for a build without it).
#
#   scripts/nvme_write_ab.sh BIN_A BIN_B [OUT]   # OUT default bench-out/nvme-write-ab
#
# Needs SPDK from ../shared/spdk/build.sh ($SPDK_DIR). Holds
# /work/wt/bench.lock (or $BENCH_LOCK) exclusively while it measures.
set -euo pipefail
. "$(dirname "$0")/nvmf_config.sh"
cd "$(dirname "$0")/.."
A=$1 B=$2 OUT=${3:-bench-out/nvme-write-ab}
SPDK=${SPDK_DIR:-$HOME/.cache/iopace-spdk-v26.05}
REPS=${REPS:-3} RUNTIME=${RUNTIME:-8} LOCK=${BENCH_LOCK:-/work/wt/bench.lock}
PORT=${PORT:-4432} NQN=nqn.2026-11.io.iopace:default
[ -f "$SPDK/.built" ] || { echo "no SPDK build at $SPDK" >&2; exit 2; }
export LD_LIBRARY_PATH=$SPDK/build/lib
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/nvme-write-ab.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }; rm -rf "$WORK"; }
trap cleanup EXIT
nvmf_config "" "$WORK/rpc.sock" "$PORT" > "$WORK/iopace.toml"

# The target's CPU time so far (utime + stime), in ms.
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$PID/stat"; }

# Bytes the target received so far, and of them straight into buffers.
bytes_in() {
  "$1" rpc get_stats --rpc "$WORK/rpc.sock" | python3 -c '
import json, sys
r = json.load(sys.stdin)
r = r.get("result", r)
rs = r.get("reactors", r) if isinstance(r, dict) else r
print(sum(x["bytes_in"] for x in rs), sum(x.get("bytes_in_direct", 0) for x in rs))'
}

# perf BIN LABEL NAME REP ARGS...: one run; appends "label name rep iops
# mibs avg_us cpu_ms_per_gib direct" (the target's CPU time per GiB
# written: less swayed by a loaded machine than the throughput; the share
# of received bytes that landed straight in buffers).
perf() {
  local bin=$1 label=$2 name=$3 rep=$4; shift 4
  local log="$OUT/perf-$label-$name-$rep.txt" c0 c1 b0 b1
  c0=$(cpu_ms)
  b0=$(bytes_in "$bin")
  "$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 512 -i 9 -c 0x2 "$@" \
    -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" > "$log" 2>&1
  c1=$(cpu_ms)
  b1=$(bytes_in "$bin")
  local direct
  direct=$(echo "$b0 $b1" | awk '{d = $3 - $1; printf "%.3f", (d > 0 ? ($4 - $2) / d : 0)}')
  grep '^Total' "$log" | tail -1 | awk -v t="$label" -v n="$name" -v r="$rep" -v c="$((c1 - c0))" \
    -v s="$RUNTIME" -v d="$direct" -F: '{split($2, f, " "); gib = f[2] * s / 1024;
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\n", t, n, r, f[1], f[2], f[3], c / gib, d}' >> "$OUT/results.tsv"
}

exec 9>"$LOCK"
flock -x 9
printf 'bin\tworkload\trep\tiops\tmibs\tavg_us\tcpu_ms_per_gib\tdirect\n' > "$OUT/results.tsv"
uptime > "$OUT/load.txt"
for rep in $(seq "$REPS"); do
  order="A B"; [ $((rep % 2)) = 0 ] && order="B A"
  for x in $order; do
    bin=$A; [ "$x" = B ] && bin=$B
    taskset -c 0 "$bin" serve --config "$WORK/iopace.toml" > "$OUT/iopace-$x-$rep.log" 2>&1 &
    PID=$!
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    perf "$bin" "$x" 128k-write-qd16 "$rep" -q 16 -o 131072 -w write -t "$RUNTIME"
    perf "$bin" "$x" 128k-write-qd16-digests "$rep" -q 16 -o 131072 -w write -t "$RUNTIME" -H -I
    perf "$bin" "$x" 4k-randwrite-qd32 "$rep" -q 32 -o 4096 -w randwrite -t "$RUNTIME"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  done
done
uptime >> "$OUT/load.txt"
flock -u 9
python3 - "$OUT/results.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
for w in sorted({r['workload'] for r in rows}):
    for b in ('A', 'B'):
        v = [float(r['mibs']) for r in rows if r['workload'] == w and r['bin'] == b]
        c = [float(r['cpu_ms_per_gib']) for r in rows if r['workload'] == w and r['bin'] == b]
        d = [float(r['direct']) for r in rows if r['workload'] == w and r['bin'] == b]
        if v:
            print(f"{w}\t{b}\tmedian {statistics.median(v):.0f} MiB/s ({min(v):.0f}-{max(v):.0f})"
                  f"\tCPU {statistics.median(c):.0f} ms/GiB ({min(c):.0f}-{max(c):.0f})"
                  f"\tdirect {statistics.median(d):.2f}")
PY
