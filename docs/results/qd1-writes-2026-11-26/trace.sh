#!/bin/bash
# trace.sh BIN RW [SECS]: serves the embedded default's RAM export over a Unix
# socket, runs fio's nbd engine at QD 1 (4 KiB) and records the server's
# io_uring completions and io_uring_enter calls for 1 s; prints per IO:
# recv completions and their sizes, sends, enters. Needs perf and fio.
BIN=$1; RW=$2; SECS=${3:-4}
D=$(mktemp -d); S=$D/s
$BIN serve --unix $S --tcp none --rpc none >$D/log 2>&1 & P=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
fio --name=w --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=write --bs=1m --size=256m >/dev/null 2>&1
fio --name=c --ioengine=nbd --uri="nbd+unix:///default?socket=$S" --rw=$RW --bs=4k --size=256m \
  --iodepth=1 --time_based --runtime=$SECS --output-format=json >$D/fio.json 2>/dev/null & F=$!
sleep 1.5
perf record -q -o $D/perf.data -e io_uring:io_uring_complete -e syscalls:sys_enter_io_uring_enter \
  -e syscalls:sys_exit_io_uring_enter -p $P -- sleep 1 >/dev/null 2>&1
wait $F
kill $P; wait $P 2>/dev/null
perf script -i $D/perf.data -F tid,time,event,trace 2>/dev/null > $D/script.txt
python3 - $D/script.txt <<'PY'
import re,sys,collections
recv=collections.Counter(); sends=0; enters=0; ios=0
for l in open(sys.argv[1]):
    if 'sys_enter_io_uring_enter' in l: enters+=1; continue
    m=re.search(r'user_data 0x([0-9a-f]+), result (-?\d+)',l)
    if not m: continue
    ud=int(m.group(1),16); res=int(m.group(2)); kind=ud>>60
    if kind==2: recv[res]+=1
    elif kind==3: sends+=1; ios+=1
n=max(ios,1)
import statistics
ev=[]
for l in open(sys.argv[1]):
    m=re.search(r'\s([\d.]+):.*user_data 0x([0-9a-f]+), result (-?\d+)',l)
    if m: ev.append((float(m.group(1)),int(m.group(2),16)>>60))
srv=[];cli=[];last_recv=None;last_send=None
for t,k in ev:
    if k==2:
        if last_send is not None: cli.append(t-last_send)
        last_recv=t; last_send=None
    elif k==3 and last_recv is not None:
        srv.append(t-last_recv); last_send=t; last_recv=None
q=lambda v,p: sorted(v)[int(p*(len(v)-1))]*1e6 if v else 0
print(f"recv->send done (server) p50 {q(srv,.5):.1f} p90 {q(srv,.9):.1f} us; send->next recv (client) p50 {q(cli,.5):.1f} p90 {q(cli,.9):.1f} us")
print(f"sends={sends} enters/io={enters/n:.2f} recv/io={sum(recv.values())/n:.2f}")
print("recv sizes:", recv.most_common(6))
PY
cp $D/script.txt /tmp/trace-$RW.txt
rm -rf $D
