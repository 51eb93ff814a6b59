#!/bin/bash
# perf of iopace serving 128 KiB reads over Unix at QD 32 (data written first)
W=/tmp/perf128; rm -rf $W; mkdir -p $W
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
${BIN:-target/release/iopace} serve --config $W/c.toml > $W/serve.log 2>&1 &
PID=$!
sleep 1
fio --name=fill --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=write --bs=1m --size=256m --iodepth=8 > /dev/null
fio --name=r --ioengine=nbd --uri="nbd+unix:///bench?socket=$W/s.sock" --rw=randread --bs=128k --size=256m --iodepth=32 --time_based --runtime=12 --output-format=json > $W/fio.json &
F=$!
sleep 3
perf record -g -p $PID -o $W/perf.data -- sleep 6 2> $W/perf.err
wait $F
kill $PID; wait $PID
perf report -i $W/perf.data --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -v '^$' | head -120 > $W/report.txt
python3 -c "import json;j=json.load(open('$W/fio.json'));print('MiB/s', j['jobs'][0]['read']['bw']/1024)"
