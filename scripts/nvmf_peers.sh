#!/usr/bin/env bash
# NVMe/TCP: iopace against SPDK's nvmf_tgt, with spdk_nvme_perf as the host.
# Each target gets core 0 alone (taskset / -m 0x1; one target runs at a
# time), perf core 1, a fresh 1 GiB RAM disk written through once (so
# neither reads holes), loopback TCP. Targets alternate (order flipped each
# rep); REPS reps (default 3) of RUNTIME s (default 8) per workload. The
# fill runs FILL s (default 3): longer where first writes are slow (a huge
# page's first fault on this VM), so the whole disk is written before reads.
#
#   scripts/nvmf_peers.sh [OUT]     # OUT: results directory (default bench-out/nvmf-peers)
#
# Needs SPDK from ../shared/spdk/build.sh ($SPDK_DIR, default
# ~/.cache/iopace-spdk-v26.05) and target/release/iopace. Holds
# /work/wt/bench.lock (or $BENCH_LOCK) exclusively while it measures.
set -euo pipefail
. "$(dirname "$0")/nvmf_config.sh"
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/nvmf-peers}
SPDK=${SPDK_DIR:-$HOME/.cache/iopace-spdk-v26.05}
REPS=${REPS:-3}
RUNTIME=${RUNTIME:-8}
FILL=${FILL:-3}
LOCK=${BENCH_LOCK:-/work/wt/bench.lock}
# iopace: the default poll mode (adaptive); iopace-busy: poll = "busy", like SPDK.
# base, base-busy: the same with $BASE_BIN (an older build), for an A/B in one run.
TARGETS=${TARGETS:-spdk iopace iopace-busy}
BIN=target/release/iopace
BASE_BIN=${BASE_BIN:-}
[ -f "$SPDK/.built" ] || { echo "no SPDK build at $SPDK: run ../shared/spdk/build.sh" >&2; exit 2; }
[ -x "$BIN" ] || cargo build --release -p iopace
export LD_LIBRARY_PATH=$SPDK/build/lib
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/nvmf-peers.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

SPDK_PORT=4430 IOPACE_PORT=4431
SPDK_NQN=nqn.2016-06.io.spdk:cnode1 IOPACE_NQN=nqn.2026-11.io.iopace:default

start_spdk() {
  "$SPDK/build/bin/nvmf_tgt" -m 0x1 -u --no-huge -s 2048 -r "$WORK/spdk.sock" -i 7 \
    > "$OUT/nvmf_tgt.log" 2>&1 &
  SPDK_PID=$!; PIDS+=("$SPDK_PID")
  local rpc=(python3 "$SPDK/scripts/rpc.py" -s "$WORK/spdk.sock")
  for _ in $(seq 100); do "${rpc[@]}" spdk_get_version >/dev/null 2>&1 && break; sleep 0.1; done
  "${rpc[@]}" nvmf_create_transport -t TCP >/dev/null
  "${rpc[@]}" bdev_malloc_create -b Malloc0 1024 512 >/dev/null
  "${rpc[@]}" nvmf_create_subsystem "$SPDK_NQN" -a -s SPDK0001 >/dev/null
  "${rpc[@]}" nvmf_subsystem_add_ns "$SPDK_NQN" Malloc0 >/dev/null
  "${rpc[@]}" nvmf_subsystem_add_listener "$SPDK_NQN" -t tcp -a 127.0.0.1 -s $SPDK_PORT >/dev/null
}

start_iopace() {   # $1: the reactor's poll mode; $2: the binary
  nvmf_config "$1" "" "$IOPACE_PORT" > "$WORK/iopace.toml"
  taskset -c 0 "$2" serve --config "$WORK/iopace.toml" > "$OUT/iopace.log" 2>&1 &
  IOPACE_PID=$!; PIDS+=("$IOPACE_PID")
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$IOPACE_PORT) 2>/dev/null && break; sleep 0.1; done
}

# perf TARGET NAME ARGS...: one run; appends "target name rep iops mibs avg_us" to results.tsv.
perf() {
  local target=$1 name=$2 rep=$3; shift 3
  local port=$SPDK_PORT nqn=$SPDK_NQN
  case $target in iopace* | base*) port=$IOPACE_PORT nqn=$IOPACE_NQN ;; esac
  local log="$OUT/perf-$target-$name-$rep.txt"
  "$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 512 -i 8 -c 0x2 "$@" \
    -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn" > "$log" 2>&1
  local total; total=$(grep '^Total' "$log" | tail -1)
  # Total : IOPS MiB/s Average min max
  echo "$total" | awk -v t="$target" -v n="$name" -v r="$rep" -F: \
    '{split($2, f, " "); printf "%s\t%s\t%s\t%s\t%s\t%s\n", t, n, r, f[1], f[2], f[3]}' >> "$OUT/results.tsv"
}

stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# Idle CPU of a target's process over 5 s (utime+stime ticks).
idle_cpu() {
  local a b; a=$(awk '{print $14+$15}' "/proc/$2/stat"); sleep 5; b=$(awk '{print $14+$15}' "/proc/$2/stat")
  echo "$1 idle CPU: $(( (b - a) * 100 / (5 * $(getconf CLK_TCK)) ))% of a core" | tee -a "$OUT/idle.txt"
}

exec 9>"$LOCK"
flock -x 9
printf 'target\tworkload\trep\tiops\tmibs\tavg_us\n' > "$OUT/results.tsv"
: > "$OUT/idle.txt"
: > "$OUT/memory.txt"
uptime > "$OUT/load.txt"
# One target runs at a time (SPDK's reactor spins on core 0 even when idle),
# started afresh and filled once per rep, in alternating order.
for rep in $(seq "$REPS"); do
  order=$TARGETS; [ $((rep % 2)) = 0 ] && order=$(echo "$TARGETS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for t in $order; do
    case $t in
      spdk) start_spdk; pid=$SPDK_PID ;;
      iopace) start_iopace adaptive "$BIN"; pid=$IOPACE_PID ;;
      iopace-busy) start_iopace busy "$BIN"; pid=$IOPACE_PID ;;
      base) start_iopace adaptive "$BASE_BIN"; pid=$IOPACE_PID ;;
      base-busy) start_iopace busy "$BASE_BIN"; pid=$IOPACE_PID ;;
    esac
    perf "$t" fill "$rep" -q 16 -o 131072 -w write -t "$FILL"   # no read sees a hole
    # Resident after the fill (about 1 GiB more than at start if it covered
    # the disk), and how much of it is huge pages.
    echo "$t $rep $(grep -E '^(Rss|AnonHugePages)' "/proc/$pid/smaps_rollup" | tr -s ' ' | paste -sd ' ')" \
      >> "$OUT/memory.txt"
    perf "$t" 4k-randread-qd32 "$rep" -q 32 -o 4096 -w randread -t "$RUNTIME"
    perf "$t" 4k-randread-qd1 "$rep" -q 1 -o 4096 -w randread -t "$RUNTIME"
    perf "$t" 4k-randwrite-qd32 "$rep" -q 32 -o 4096 -w randwrite -t "$RUNTIME"
    perf "$t" 128k-read-qd16 "$rep" -q 16 -o 131072 -w read -t "$RUNTIME"
    [ "$rep" = 1 ] && idle_cpu "$t" "$pid"
    stop_pid "$pid"
  done
done
uptime >> "$OUT/load.txt"
flock -u 9
python3 - "$OUT/results.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
work = sorted({r["workload"] for r in rows if r["workload"] != "fill"}, key=lambda w: rows.index(next(r for r in rows if r["workload"] == w)))
targets = [t for t in ("iopace", "iopace-busy", "base", "base-busy") if any(r["target"] == t for r in rows)]
print("| workload | SPDK nvmf_tgt | " + " | ".join(f"{t} | {t} / SPDK" for t in targets) + " |")
print("|---|---|" + "---|---|" * len(targets))
for w in work:
    def vals(t, k):
        return [float(r[k]) for r in rows if r["workload"] == w and r["target"] == t]
    def med(t, k):
        v = vals(t, k)
        return statistics.median(v) if v else float("nan")
    k, unit = ("mibs", "MiB/s") if "128k" in w else ("iops", "IOPS")
    s = med("spdk", k)
    # The median of the reps, and their range.
    def cell(t):
        v = vals(t, k) or [float("nan")]
        lat = f", {med(t, 'avg_us'):.1f} us" if w.endswith("qd1") else ""
        return f"{med(t, k):,.0f} {unit}{lat} ({min(v):,.0f}-{max(v):,.0f})"
    cells = [f"{cell(t)} | {med(t, k) / s:.2f}x" for t in targets]
    print(f"| {w} | {cell('spdk')} | " + " | ".join(cells) + " |")
PY
