#!/usr/bin/env python3
"""Where the server's time goes at 128 KiB QD 32 reads over Unix (diagnostic).

For each server (peers.py's configs, started by its Server class), fill, run
fio's nbd engine 128 KiB random reads at QD 32 for 10 s, and from 3 s in:
per-thread CPU of the server over 4 s (/proc/PID/task) and `perf record -g`
of the server for 4 s. Writes DIR/NAME.perf.data and prints per-thread CPU.
usage: IOPACE=... diag.py DIR SERVER...   (under flock /work/wt/bench.lock)
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../bench"))
import peers  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            comm = head.split("(", 1)[1]
            fields = rest.split()
            out[tid] = (comm, int(fields[11]) + int(fields[12]), int(fields[36]))  # utime+stime, last CPU
        except FileNotFoundError:
            pass
    return out


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="iopace-diag-")
    for name in sys.argv[2:]:
        srv = peers.Server(name, "unix", work)
        srv.start()
        try:
            argv = ["fio", "--name=diag", "--ioengine=nbd", f"--uri={srv.uri}", "--rw=randread", "--bs=128k",
                    "--iodepth=32", f"--size={peers.SIZE}", "--time_based", "--runtime=10", "--output-format=json"]
            fio = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            time.sleep(3)
            t0 = threads(srv.proc.pid)
            w0 = time.time()
            subprocess.run(["perf", "record", "-F", "2000", "-g", "-o", os.path.join(outdir, f"{name}.perf.data"),
                            "-p", str(srv.proc.pid), "--", "sleep", "4"], capture_output=True)
            t1 = threads(srv.proc.pid)
            wall = time.time() - w0
            out = fio.communicate()[0]
            import json
            j = json.loads(out[out.index("{"):])["jobs"][0]
            print(f"{name}: {j['read']['bw'] / 1024:.0f} MiB/s, fio usr+sys {j['usr_cpu'] + j['sys_cpu']:.0f}% "
                  f"(perf running; window {wall:.1f} s)")
            for tid, (comm, ticks, cpu) in sorted(t1.items(), key=lambda kv: -kv[1][1]):
                d = ticks - t0.get(tid, (comm, 0, 0))[1]
                if d:
                    print(f"  thread {tid} {comm:16} {d / CLK / wall * 100:5.1f}% of a core (last on CPU {cpu})")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
