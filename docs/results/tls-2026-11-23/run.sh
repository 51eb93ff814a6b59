#!/bin/sh
# TLS cost: nbdcopy reads a 1 GiB RAM export to null: (no extents, one
# connection) over plaintext TCP and over TLS, from iopace and from nbdkit,
# at 4 KiB x 32 requests and 128 KiB x 8 requests. Prints wall time, MiB/s,
# and the server's CPU seconds (all threads, from /proc) per 1000 requests.
# Usage: run.sh IOPACE_BINARY CERT_DIR (ca-cert.pem, server-*.pem, client-*.pem)
set -eu
BIN=$1; CERTS=$2; PORT=19909; TLSPORT=19910
WORK=$(mktemp -d)
cat > "$WORK/c.toml" <<TOML
[server]
reactors = 1
tcp = ["127.0.0.1:$PORT", { addr = "127.0.0.1:$TLSPORT", tls = "require" }]
unix = []
rpc = ""
[tls]
cert = "$CERTS/server-cert.pem"
key = "$CERTS/server-key.pem"
ca = "$CERTS/ca-cert.pem"
[[bdev]]
name = "m"
kind = "malloc"
size = "1GiB"
[[export]]
name = "default"
bdev = "m"
TOML
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
measure() { # name pid uri bs requests
  c0=$(cpu $2); t0=$(date +%s.%N)
  nbdcopy --no-extents --connections=1 --request-size=$4 --requests=$5 "$3" null:
  t1=$(date +%s.%N); c1=$(cpu $2)
  awk -v n="$1" -v bs=$4 -v q=$5 -v t0=$t0 -v t1=$t1 -v c0=$c0 -v c1=$c1 -v hz=$(getconf CLK_TCK) 'BEGIN {
    s = t1 - t0; ios = 1073741824 / bs; cpu = (c1 - c0) / hz;
    printf "%-22s %6d KiB x %-2d %6.2f s %8.1f MiB/s  server CPU %5.2f s  %6.1f us CPU/request\n", n, bs/1024, q, s, 1024 / s, cpu, cpu / ios * 1e6 }'
}
"$BIN" serve --config "$WORK/c.toml" 2>"$WORK/iopace.log" & IOPACE=$!
sleep 1
nbdkit -f -p $((PORT + 2)) memory 1G & NBDKIT=$!
nbdkit -f -p $((PORT + 3)) --tls=require --tls-certificates="$CERTS" memory 1G & NBDKIT_TLS=$!
sleep 1
NBDS="tls-certificates=$CERTS"
for sz in "4096 32" "131072 8"; do
  set -- $sz
  measure "iopace plaintext" $IOPACE "nbd://127.0.0.1:$PORT/default" $1 $2
  measure "iopace TLS" $IOPACE "nbds://127.0.0.1:$TLSPORT/default?$NBDS" $1 $2
  measure "nbdkit plaintext" $NBDKIT "nbd://127.0.0.1:$((PORT + 2))/" $1 $2
  measure "nbdkit --tls=require" $NBDKIT_TLS "nbds://127.0.0.1:$((PORT + 3))/?$NBDS" $1 $2
done
kill $IOPACE $NBDKIT $NBDKIT_TLS
wait $IOPACE 2>/dev/null || true
rm -rf "$WORK"
