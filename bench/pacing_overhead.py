#!/usr/bin/env python3
"""Pacing overhead on the hot path: `auto` against `none` on an unshaped Unix
socket, 4 KiB random reads and writes at QD 32, alternating modes on one
target through the set_pacing RPC and repeating. Reports server CPU per IO.

Knobs: REPS=5 RUNTIME=5 IOPACE=target/release/iopace
"""
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IOPACE = os.environ.get("IOPACE", os.path.join(ROOT, "target/release/iopace"))
REPS = int(os.environ.get("REPS", "5"))
RUNTIME = int(os.environ.get("RUNTIME", "5"))
CLK = os.sysconf("SC_CLK_TCK")


def rpc(path, method, params=None):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            data += s.recv(65536)
    reply = json.loads(data)
    if "error" in reply:
        raise SystemExit(f"rpc {method}: {reply['error']}")
    return reply["result"]


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return int(x[11]) + int(x[12])


def main():
    work = tempfile.mkdtemp(prefix="iopace-overhead-")
    sock, adm = f"{work}/nbd.sock", f"{work}/adm.sock"
    srv = subprocess.Popen([IOPACE, "serve", "--unix", sock, "--rpc", adm, "--tcp", "none", "--reactors", "1"],
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(adm):
                break
            time.sleep(0.05)
        res = {}
        for rep in range(REPS):
            for mode in (["none", "auto"] if rep % 2 == 0 else ["auto", "none"]):
                rpc(adm, "set_pacing", {"mode": mode})
                for rw in ["randread", "randwrite"]:
                    t0 = ticks(srv.pid)
                    out = subprocess.run(
                        ["fio", "--name=o", "--ioengine=nbd", f"--uri=nbd+unix:///default?socket={sock}", f"--rw={rw}",
                         "--bs=4k", "--iodepth=32", "--size=256m", "--time_based", f"--runtime={RUNTIME}",
                         "--output-format=json"], capture_output=True, text=True, check=True).stdout
                    t1 = ticks(srv.pid)
                    side = json.loads(out[out.index("{"):])["jobs"][0]["read" if rw == "randread" else "write"]
                    cpu = (t1 - t0) / CLK * 1e6 / side["total_ios"]
                    res.setdefault((mode, rw), []).append((side["iops"], cpu))
                    print(f"rep {rep + 1} {mode:5} {rw:9} {side['iops']:9.0f} IOPS  {cpu:.2f} us CPU/IO", flush=True)
        print()
        print("| job | mode | IOPS (median) | server CPU/IO, us (median, min-max) |")
        print("|---|---|---|---|")
        for rw in ["randread", "randwrite"]:
            for mode in ["none", "auto"]:
                v = res[(mode, rw)]
                cpus = [c for _, c in v]
                print(f"| {rw} 4k QD32 | {mode} | {statistics.median(i for i, _ in v):.0f} | "
                      f"{statistics.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f}) |")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
