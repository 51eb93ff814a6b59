#!/bin/sh
# TLS throughput and server CPU: `nbdcopy -C 1` (or CONNS, below) of 1 GiB of random data from
# a RAM export to null:, over TLS (STARTTLS, no client certificates), iopace
# and nbdkit --tls=require alternating, at 64 KiB and 256 KiB requests; with
# iopace in plaintext beside them, and optionally a second iopace binary
# (the one before a change, in TLS and plaintext). Server CPU is utime+stime from /proc/PID/stat
# around each copy; client CPU (nbdcopy's, GnuTLS decrypting included) is
# the timing shell's cutime+cstime around it. Each timed copy holds
# /work/wt/bench.lock.
#
# Usage: [CONNS="1 2 4"] scripts/tls_reactor_bench.sh OUT_DIR [REPS] [IOPACE] [IOPACE_BEFORE]
# CONNS: the connection counts the timed copies alternate (default 1),
# each run as `nbdcopy -C N -T N`: nbdcopy opens no more connections than
# threads, and its threads default to the cores (its default -C 4 is 2
# connections on 2 cores). It falls back to one connection where a server
# does not advertise multi-conn, so the script prints what each advertises.
# Writes OUT_DIR/results.csv (one line per copy) and prints a summary; the
# data, certificates and logs stay in OUT_DIR (outside the repository).
# Before the timed copies it checks the TLS path end to end: the data goes in
# through TLS and comes back out through TLS identical (cmp).
set -eu
OUT=$1
REPS=${2:-3}
IOPACE=${3:-target/release/iopace}
BEFORE=${4:-}
CONNS=${CONNS:-1}
LOCK=/work/wt/bench.lock
PORT_TLS=10931
PORT_PLAIN=10932
PORT_BEFORE=10933
PORT_KIT=10934
PORT_BEFORE_PLAIN=10935
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CERTS=$OUT/certs
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

if [ ! -f "$CERTS/ca-cert.pem" ]; then
    mkdir -p "$CERTS"
    (
        cd "$CERTS"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca-cert.pem -days 2 -subj "/CN=bench CA" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
        openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj "/CN=localhost"
        printf "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" > server.ext
        openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 2 -extfile server.ext
    ) >/dev/null 2>&1
fi
DATA=$OUT/data.raw
[ -f "$DATA" ] || head -c 1073741824 /dev/urandom > "$DATA"

config() { # PORT TLS_MODE
    cat <<EOF
[server]
tcp = [{ addr = "127.0.0.1:$1", tls = "$2" }]
rpc = ""
unix = []
[[bdev]]
name = "m0"
kind = "malloc"
size = "1GiB"
[[export]]
name = "default"
bdev = "m0"
[tls]
cert = "$CERTS/server-cert.pem"
key = "$CERTS/server-key.pem"
EOF
}

start_iopace() { # NAME BINARY PORT TLS_MODE
    config "$3" "$4" > "$OUT/$1.toml"
    "$2" serve --config "$OUT/$1.toml" > "$OUT/$1.log" 2>&1 &
    echo $!
}

wait_port() {
    for _ in $(seq 100); do
        nbdinfo --size "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "no server at $1" >&2
    exit 1
}

cpu_ticks() { # PID: utime+stime
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

TLS_Q="?tls-certificates=$CERTS"
URI_TLS="nbds://127.0.0.1:$PORT_TLS/default$TLS_Q"
URI_PLAIN="nbd://127.0.0.1:$PORT_PLAIN/default"
URI_BEFORE="nbds://127.0.0.1:$PORT_BEFORE/default$TLS_Q"
URI_KIT="nbds://127.0.0.1:$PORT_KIT/$TLS_Q"

P_TLS=$(start_iopace iopace-tls "$IOPACE" $PORT_TLS require)
P_PLAIN=$(start_iopace iopace-plain "$IOPACE" $PORT_PLAIN off)
PIDS="$P_TLS $P_PLAIN"
nbdkit -f -p $PORT_KIT -i 127.0.0.1 --tls=require --tls-certificates="$CERTS" memory 1G \
    > "$OUT/nbdkit.log" 2>&1 &
P_KIT=$!
PIDS="$PIDS $P_KIT"
SERVERS="iopace-tls:$P_TLS:$URI_TLS nbdkit-tls:$P_KIT:$URI_KIT iopace-plain:$P_PLAIN:$URI_PLAIN"
if [ -n "$BEFORE" ]; then
    P_BEFORE=$(start_iopace iopace-before "$BEFORE" $PORT_BEFORE require)
    P_BEFORE_PLAIN=$(start_iopace iopace-before-plain "$BEFORE" $PORT_BEFORE_PLAIN off)
    PIDS="$PIDS $P_BEFORE $P_BEFORE_PLAIN"
    SERVERS="$SERVERS iopace-before-tls:$P_BEFORE:$URI_BEFORE"
    SERVERS="$SERVERS iopace-before-plain:$P_BEFORE_PLAIN:nbd://127.0.0.1:$PORT_BEFORE_PLAIN/default"
fi
for s in $SERVERS; do
    uri=${s#*:}
    uri=${uri#*:}
    wait_port "$uri"
    nbdcopy -C 4 --request-size=1048576 "$DATA" "$uri"
    mc=no
    nbdinfo --can multi-conn "$uri" && mc=yes
    echo "${s%%:*}: multi-conn $mc"
done
# The TLS path both ways: in above, out here.
nbdcopy -C 1 "$URI_TLS" "$OUT/back.raw"
cmp "$DATA" "$OUT/back.raw"
rm -f "$OUT/back.raw"
echo "data in and out through iopace's TLS: identical"

CSV=$OUT/results.csv
# New columns go last, so that readers of the old seven keep working.
echo "server,request_size,rep,seconds,mib_per_s,server_cpu_s_per_gib,load1,conns,client_cpu_s_per_gib" > "$CSV"
TCK=$(getconf CLK_TCK)
for rep in $(seq "$REPS"); do
    for size in 65536 262144; do
        for conns in $CONNS; do
            for s in $SERVERS; do
                name=${s%%:*}
                rest=${s#*:}
                pid=${rest%%:*}
                uri=${rest#*:}
                # $$ below is the timing shell: its cutime+cstime grow by
                # nbdcopy's CPU (all its threads) once nbdcopy is reaped.
                line=$(flock "$LOCK" sh -c '
                    load=$(cut -d" " -f1 /proc/loadavg)
                    c0=$(awk "{ print \$14 + \$15 }" /proc/'"$pid"'/stat)
                    k0=$(awk "{ print \$16 + \$17 }" /proc/$$/stat)
                    t0=$(date +%s.%N)
                    nbdcopy -C '"$conns"' -T '"$conns"' --request-size='"$size"' "'"$uri"'" null:
                    t1=$(date +%s.%N)
                    c1=$(awk "{ print \$14 + \$15 }" /proc/'"$pid"'/stat)
                    k1=$(awk "{ print \$16 + \$17 }" /proc/$$/stat)
                    echo "$t0 $t1 $c0 $c1 $load $k0 $k1"')
                echo "$line" | awk -v n="$name" -v sz="$size" -v r="$rep" -v c="$conns" -v tck="$TCK" \
                    '{ s = $2 - $1; printf "%s,%d,%d,%.3f,%.1f,%.3f,%s,%d,%.3f\n", n, sz, r, s, 1024 / s, ($4 - $3) / tck, $5, c, ($7 - $6) / tck }' \
                    >> "$CSV"
            done
        done
    done
done
cleanup
PIDS=""
echo
# Per server, size and connection count: median (range) over the reps;
# then iopace TLS over nbdkit TLS within each rep, median (range).
awk -F, '
function add(k, v) { n[k]++; val[k, n[k]] = v }
function med(k,   i, j, t, a) {
    for (i = 1; i <= n[k]; i++) a[i] = val[k, i]
    for (i = 2; i <= n[k]; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return sprintf(fmt, a[int((n[k] + 1) / 2)]) " (" sprintf(fmt, a[1]) "-" sprintf(fmt, a[n[k]]) ")"
}
NR > 1 {
    k = sprintf("%-20s %3dKiB -C %d", $1, $2 / 1024, $8 == "" ? 1 : $8)
    keys[k] = 1
    add(k " mib", $5); add(k " cpu", $6); add(k " cli", $9)
    r = $2 / 1024 "KiB -C " ($8 == "" ? 1 : $8)
    if ($1 == "iopace-tls") { im[r, $3] = $5; ic[r, $3] = $6 }
    if ($1 == "nbdkit-tls") { km[r, $3] = $5; kc[r, $3] = $6 }
    rows[r] = 1
} END {
    for (k in keys) {
        fmt = "%.0f"; m = med(k " mib"); fmt = "%.2f"
        printf "%s  MiB/s %-18s server s/GiB %-18s client s/GiB %s\n", k, m, med(k " cpu"), med(k " cli")
    }
    for (q in im) {
        split(q, p, SUBSEP)
        if ((q in km) && km[q] > 0 && kc[q] > 0) { add(p[1] " tput", im[q] / km[q]); add(p[1] " cpu", ic[q] / kc[q]) }
    }
    fmt = "%.2f"
    for (r in rows) if (n[r " tput"]) printf "ratio iopace/nbdkit %-14s MiB/s %s  server CPU/GiB %s\n", r, med(r " tput"), med(r " cpu")
}' "$CSV" | sort
