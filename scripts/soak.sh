#!/bin/sh
# Soak: iopace under 4 fio verify clients for DURATION seconds (default 600),
# with random client disconnects (fio killed mid-run, no NBD_CMD_DISC), a
# pacing mode change every 10 s, a SIGHUP every 30 s, and faults on: the
# export is a fault bdev over the file (issue 38) failing 1 in 1000 reads
# with EIO, adding 2 ms to 1 in 100 IOs, and stalling all IO for 200 ms
# every 20 s. Writes never fail, so every block a client reads back is one
# it wrote: fio skips the reads that fault (continue_on_error=read) and
# checks all the others. At the end it counts verify errors, leaked buffers
# (requests or buffers of any class still held once every client is gone)
# and RSS growth after warm-up, and prints one summary; exit status 0 only
# if all meet issue 13's goals (0 verify errors, 0 leaked buffers, RSS
# growth under 5%).
# RSS is split in two: the data buffer pool is one mapping allocated at
# start (its size is get_stats' pool_bytes), whose pages count once first
# used, so it grows each time more buffers are in use at once than ever
# before; the growth goal applies to the rest, where a leak would show,
# from a baseline taken after warm-up (a quarter of the run, 20 to 120 s;
# over NVMe/TCP half of a run of 240 s or less).
#
# PROTOCOL nvme (default nbd): the same over NVMe/TCP, the clients being
# SPDK's bdevperf -w verify (-f: a failed IO is counted, not fatal), two
# clients (bdevperf polls its core), each on a quarter of the namespace
# of its own (a bdev split in bdevperf's config), killed mid-run at
# random like the fio runs; every I/O completion error a client prints must
# be the fault's NVMe status, INTERNAL DEVICE ERROR (00/06). It needs
# SPDK's build (../shared/spdk/build.sh) in $SPDK_DIR, default
# ~/.cache/iopace-spdk-v26.05.
#
# Usage: scripts/soak.sh IOPACE_BINARY [DURATION_S] [nbd|nvme]
# Run it under the shared bench lock: flock /work/wt/bench.lock timeout 900 ...
set -u
BIN=$1
DURATION=${2:-600}
PROTOCOL=${3:-nbd}
SPDK_DIR=${SPDK_DIR:-$HOME/.cache/iopace-spdk-v26.05}
WORK=$(mktemp -d /tmp/iopace-soak.XXXXXX)
SOCK=$WORK/nbd.sock
RPC=$WORK/admin.sock
BUFFERS=500
NVME_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
NVME_LISTEN=""
[ "$PROTOCOL" = nvme ] && NVME_LISTEN="nvme_tcp = [\"127.0.0.1:$NVME_PORT\"]"
cat > "$WORK/iopace.toml" <<TOML
[server]
reactors = 2
tcp = []
unix = ["$SOCK"]
rpc = "$RPC"
$NVME_LISTEN
[buffers]
num_shared_buffers = $BUFFERS
buffer_size = "128KiB"
buf_cache_size = 16
[[bdev]]
name = "disk"
kind = "file"
path = "$WORK/disk.img"
size = "1GiB"
[[bdev]]
name = "flaky"
kind = "fault"
base = "disk"
ops = ["read"]
errno = "EIO"
error_rate = 0.001
spike_us = 2000
spike_rate = 0.01
[[export]]
name = "default"
bdev = "flaky"
[pacing]
mode = "auto"
TOML
"$BIN" serve --config "$WORK/iopace.toml" 2> "$WORK/iopace.log" &
PID=$!
for _ in $(seq 100); do [ -S "$RPC" ] && break; sleep 0.1; done
rpc() { "$BIN" rpc --rpc "$RPC" "$@"; }
# The pool's mapping, in KiB as smaps gives sizes (whole pages).
POOL_KIB=$(rpc get_stats | python3 -c '
import json, sys
b = json.load(sys.stdin)["reactors"][0]["buffers"]["pool_bytes"]
print((b + 4095) // 4096 * 4)')
# "TOTAL POOL" RSS in KiB: the whole process, and the pool's mapping.
rss_kib() {
  awk -v pool=$POOL_KIB '/^Size:/ {size = $2} /^Rss:/ {total += $2; if (size == pool) p += $2}
    END {print total, p + 0}' /proc/$PID/smaps
}

# One client: short fio runs, each writing its own 256 MiB region with
# checksums and reading back what it wrote (verify_backlog), over and over.
# A run is killed at random (about one in three) to disconnect abruptly;
# every run that finishes must have verified clean.
client_nbd() {
  i=$1; runs=0; killed=0; failed=0
  while [ ! -e "$WORK/stop" ]; do
    runs=$((runs + 1))
    log="$WORK/fio$i.$runs.log"
    fio --name=soak$i --thread --ioengine=nbd --uri="nbd+unix:///default?socket=$SOCK" \
      --offset=$((i * 256))M --size=256M --rw=randwrite --bsrange=4k-256k \
      --iodepth=16 --verify=crc32c --verify_backlog=256 --verify_fatal=1 --verify_state_save=0 \
      --continue_on_error=read \
      --randseed=$((i * 1000 + runs)) --runtime=20 --output="$log" > /dev/null 2>&1 &
    FIO=$!
    kill_it=no
    if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 3 )) -eq 0 ]; then
      sleep $(( $(od -An -N1 -tu1 /dev/urandom) % 8 + 1 ))
      kill -9 $FIO 2> /dev/null && kill_it=yes && killed=$((killed + 1))
    fi
    # A run that was not killed must end clean (verify included).
    if ! wait $FIO 2> /dev/null && [ $kill_it = no ]; then
      failed=$((failed + 1))
      cp "$log" "$WORK/failed-fio$i.$runs.log"
    fi
    rm -f "$log"
  done
  echo "$runs $killed $failed" > "$WORK/client$i"
}

# One NVMe/TCP client: bdevperf -w verify runs of 10 s on quarter $i of
# the namespace (two clients), killed at random like the fio runs. A run that was not
# killed must exit 0 with no "Buffer mismatch", and print no completion
# error but the fault's.
client_nvme() {
  i=$1; runs=0; killed=0; failed=0
  cat > "$WORK/bdevperf$i.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[
{"method":"bdev_nvme_set_options","params":{"bdev_retry_count":0}},
{"method":"bdev_nvme_attach_controller","params":{"name":"Nvme0","trtype":"tcp","adrfam":"IPv4",
 "traddr":"127.0.0.1","trsvcid":"$NVME_PORT","subnqn":"nqn.2026-11.io.iopace:default"}},
{"method":"bdev_split_create","params":{"base_bdev":"Nvme0n1","split_count":4}}]}]}
JSON
  while [ ! -e "$WORK/stop" ]; do
    runs=$((runs + 1))
    log="$WORK/bdevperf$i.$runs.log"
    LD_LIBRARY_PATH="$SPDK_DIR/build/lib" "$SPDK_DIR/build/examples/bdevperf" \
      --no-huge -s 512 -i $(( $$ % 1000 * 10 + i )) -m 0x$((1 << i)) -r "$WORK/bdevperf$i.sock" \
      --json "$WORK/bdevperf$i.json" -T Nvme0n1p$i -q 16 -o $(( (i + 1) * 4096 )) -w verify -f -t 10 \
      > "$log" 2>&1 &
    BP=$!
    kill_it=no
    if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 3 )) -eq 0 ]; then
      sleep $(( $(od -An -N1 -tu1 /dev/urandom) % 7 + 2 ))
      kill -9 $BP 2> /dev/null && kill_it=yes && killed=$((killed + 1))
    fi
    status=0; wait $BP 2> /dev/null || status=$?
    faulted=$(grep -c 'INTERNAL DEVICE ERROR (00/06)' "$log")
    # On I/O queues: bdevperf's set-up asks an admin command iopace refuses
    # (INVALID FIELD on qid 0), which SPDK notes and carries on from.
    others=$(grep 'print_completion' "$log" | grep -v ' qid:0 ' | grep -vc 'INTERNAL DEVICE ERROR (00/06)')
    echo "$faulted" >> "$WORK/nvme_faulted$i"
    if [ $kill_it = no ] && { [ $status -ne 0 ] || [ "$others" -ne 0 ] || grep -q 'Buffer mismatch' "$log"; }; then
      failed=$((failed + 1))
      cp "$log" "$WORK/failed-bdevperf$i.$runs.log"
    fi
    rm -f "$log"
  done
  echo "$runs $killed $failed" > "$WORK/client$i"
}

# bdevperf polls its core without rest: two of them, one a core.
CLIENT_IDS="0 1 2 3"; [ "$PROTOCOL" = nvme ] && CLIENT_IDS="0 1"
CLIENTS=""
for i in $CLIENT_IDS; do client_$PROTOCOL $i 2> /dev/null & CLIENTS="$CLIENTS $!"; done
START=$(date +%s)
RSS_WARM=""
WARM=$((DURATION / 4)); [ $WARM -lt 20 ] && WARM=20; [ $WARM -gt 120 ] && WARM=120
# Over NVMe/TCP each bdevperf run brings new queues whose state fills the
# allocator's arenas over the first runs (a 60 s soak grew 5.2% from 20 s
# and 1.5% from 30 s; 600 s grew 2.4%): warm up for half a short run.
[ "$PROTOCOL" = nvme ] && [ $WARM -lt $((DURATION / 2)) ] && [ $DURATION -le 240 ] && WARM=$((DURATION / 2))
POOL_WARM=0
RSS_MAX=0
MODES="rate auto buffers none"
t=0
while [ $t -lt "$DURATION" ]; do
  sleep 10
  t=$(( $(date +%s) - START ))
  mode=$(echo $MODES | cut -d' ' -f$(( (t / 10) % 4 + 1 )))
  params="{\"mode\":\"$mode\"}"
  [ "$mode" = rate ] && params="{\"mode\":\"rate\",\"period_us\":20}"
  rpc set_pacing "$params" > /dev/null || echo "set_pacing $mode failed at ${t}s"
  if [ $(( (t / 10) % 3 )) -eq 0 ]; then kill -HUP $PID; fi
  if [ $(( (t / 10) % 2 )) -eq 0 ]; then
    rpc set_fault '{"bdev":"flaky","stall_ms":200}' > /dev/null || echo "set_fault failed at ${t}s"
  fi
  set -- $(rss_kib); total=$1; pool=$2; rss=$((total - pool))
  [ -z "$RSS_WARM" ] && [ $t -ge $WARM ] && RSS_WARM=$rss && POOL_WARM=$pool
  [ "$rss" -gt "$RSS_MAX" ] && RSS_MAX=$rss
  echo "t=${t}s mode=$mode rss=${total}KiB pool=${pool}KiB rest=${rss}KiB"
done
touch "$WORK/stop"
wait $CLIENTS
# Every client is gone: nothing may still be held.
sleep 2
STATS=$(rpc get_stats)
LEAK=$(echo "$STATS" | python3 -c '
import json, sys
st = json.load(sys.stdin)
rs = st["reactors"]
held = sum(r["buffers"]["in_use"] for r in rs)
flight = sum(r["requests_in_flight"] for r in rs)
free = rs[0]["buffers"]["pool_free"]
total = rs[0]["buffers"]["pool_total"]
conns = sum(r["connections"] for r in rs)
print(held, flight, total - free, conns)')
FAULTS=$(rpc get_faults | python3 -c '
import json, sys
f = json.load(sys.stdin)[0]
print(f["errors"], f["held"])')
set -- $(rss_kib); RSS_END=$(($1 - $2)); POOL_END=$2
kill -TERM $PID; wait $PID; STATUS=$?
RUNS=0; KILLED=0; FAILED=0
for i in $CLIENT_IDS; do
  set -- $(cat "$WORK/client$i"); RUNS=$((RUNS + $1)); KILLED=$((KILLED + $2)); FAILED=$((FAILED + $3))
done
set -- $LEAK
GROWTH=$(awk -v a="$RSS_WARM" -v b="$RSS_END" 'BEGIN { printf "%.1f", (b - a) * 100 / a }')
CLIENT=fio; [ "$PROTOCOL" = nvme ] && CLIENT=bdevperf
echo "protocol $PROTOCOL; duration ${DURATION}s; $CLIENT runs $RUNS, killed mid-run $KILLED, failed (verify or IO errors) $FAILED"
[ "$PROTOCOL" = nvme ] && echo "NVMe completions with the fault's status (00/06) seen by clients: $(cat "$WORK"/nvme_faulted* | awk '{n += $1} END {print n + 0}')"
echo "after all clients left: buffers held $1, requests in flight $2, buffers missing from the pool $3, connections $4"
echo "faults: reads failed with EIO $(echo $FAULTS | cut -d' ' -f1), IOs held by stalls $(echo $FAULTS | cut -d' ' -f2)"
echo "RSS outside the buffer pool: ${RSS_WARM} KiB at ${WARM} s, ${RSS_MAX} KiB max, ${RSS_END} KiB at the end: growth ${GROWTH}%"
echo "buffer pool pages touched: ${POOL_WARM} KiB at ${WARM} s, ${POOL_END} KiB at the end (of ${POOL_KIB} KiB)"
echo "SIGHUPs: $(grep -c 'SIGHUP' "$WORK/iopace.log") log lines; server exit status $STATUS"
echo "server warnings/errors: $(grep -c -E 'WARN|ERROR' "$WORK/iopace.log")"
ok=$(awk -v f="$FAILED" -v h="$1" -v r="$2" -v m="$3" -v g="$GROWTH" -v s="$STATUS" \
  'BEGIN { print (f == 0 && h == 0 && r == 0 && m == 0 && g < 5 && s == 0) ? "yes" : "no" }')
echo "goals met: $ok (log and failed $CLIENT outputs kept in $WORK)"
[ "$ok" = yes ] && rm -rf "$WORK" && exit 0
exit 1
