#!/bin/sh
# perf profile of one tuned server under the tune_effect workload
set -eu
bin=$1 cfg=$2 out=$3
dir=$(mktemp -d /tmp/iopace-perf-XXXXXX)
sed "s#SOCK#$dir/nbd.sock#" "$(dirname "$0")/perf-job.fio" > $dir/job.fio
"$bin" serve --config "$cfg" --tcp none --unix "$dir/nbd.sock" --rpc "$dir/rpc.sock" 2>"$dir/serve.log" &
pid=$!
while [ ! -S "$dir/rpc.sock" ]; do sleep 0.1; done
fio --output-format=json $dir/job.fio > $dir/fio.json &
fpid=$!
sleep 3
perf record -F 2000 -g -p $pid -o $out -- sleep 4 2>/dev/null
for t in /proc/$pid/task/*; do echo "$(cat $t/comm) $(awk '{print $14, $15}' $t/stat)"; done
wait $fpid
kill $pid; wait $pid || true
rm -rf $dir
