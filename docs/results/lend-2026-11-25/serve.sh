# Sourced by ab.sh and perf.sh: one iopace serving a 1 GiB RAM export over
# a Unix socket in directory $W, and fio against it.
uri() { echo "nbd+unix:///bench?socket=$W/s.sock"; }

# start_server BIN: starts it, sets PID. SERVER_EXTRA: more [server] lines;
# PIN_S: the CPUs it runs on.
start_server() {
  rm -f $W/s.sock $W/rpc.sock
  cat > $W/c.toml <<EOC
[server]
tcp = []
unix = ["$W/s.sock"]
rpc = "$W/rpc.sock"
${SERVER_EXTRA:-}
[[bdev]]
name = "d"
kind = "malloc"
size = "1GiB"
[[export]]
name = "bench"
bdev = "d"
EOC
  ${PIN_S:+taskset -c $PIN_S} $1 serve --config $W/c.toml > $W/serve.log 2>&1 &
  PID=$!
  sleep 1
}

# fill_export: writes the first 256 MiB, so reads carry data.
fill_export() {
  fio --name=fill --ioengine=nbd --uri="$(uri)" --rw=write --bs=1m --size=256m --iodepth=8 > /dev/null
}

# read_128k SECONDS: 128 KiB random reads at QD 32, fio's JSON in $W/fio.json.
read_128k() {
  fio --name=r --ioengine=nbd --uri="$(uri)" --rw=randread --bs=128k --size=256m --iodepth=32 \
    --time_based --runtime=$1 --output-format=json > $W/fio.json
}

stop_server() { kill $PID; wait $PID; }

# fio_mibs: read MiB/s from $W/fio.json (fio prints a line before the JSON).
fio_mibs() {
  python3 -c "import json;t=open('$W/fio.json').read();j=json.loads(t[t.index('{'):]);print(j['jobs'][0]['read']['bw']/1024, j['jobs'][0]['read']['total_ios'])"
}
