#!/bin/bash
# ab.sh: 128 KiB randread QD 32 over Unix from a 1 GiB malloc export, written
# (fill=1: 256 MiB written first) and never written (fill=0), two builds
# alternating, the new one first. BASE=path NEW=path sh ab.sh
W=/tmp/zcab; mkdir -p $W
run() { # bin fill
  rm -f $W/s.sock $W/rpc.sock
  cat > $W/c.toml <<EOC
[server]
tcp = []
unix = ["$W/s.sock"]
rpc = "$W/rpc.sock"
[[bdev]]
name = "d"
kind = "malloc"
size = "1GiB"
[[export]]
name = "bench"
bdev = "d"
EOC
  $1 serve --config $W/c.toml > $W/serve.log 2>&1 &
  local pid=$!
  sleep 1
  [ $2 = 1 ] && fio --name=fill --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=write --bs=1m --size=256m --iodepth=8 > /dev/null
  local t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  fio --name=r --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=randread --bs=128k --size=256m --iodepth=32 --time_based --runtime=5 --output-format=json > $W/fio.json
  local t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill $pid; wait $pid
  python3 -c "import json;t=open('$W/fio.json').read();j=json.loads(t[t.index('{'):]);r=j['jobs'][0]['read'];print('%s fill=%s %.0f MiB/s cpu/io %.1f us' % ('$3', '$2', r['bw']/1024, ($t1-$t0)*1e4/r['total_ios']))"
}
for i in 1 2 3; do
  for f in 1 0; do
    run $NEW $f new; run $BASE $f base
  done
done
