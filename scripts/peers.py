#!/usr/bin/env python3
"""Peer benchmark: iopace against nbdkit and qemu-nbd, same fio nbd jobs, one run.

Servers are started and stopped by PID for each (server, transport) pair;
the order of servers alternates between repetitions. Each point reports
IOPS, MiB/s, average and p99 latency, and the server's CPU time per IO
(utime+stime from /proc/PID/stat over the job).

Environment knobs (all optional):
  REPS=3 RUNTIME=5 SIZE=256m
  SERVERS="iopace-malloc iopace-null nbdkit-memory qemu-nbd-null"
          (also: iopace-file nbdkit-file qemu-nbd-file)
  TRANSPORTS="unix tcp"
  JOBS="randread:4k:1 randread:4k:32 randread:4k:128 randwrite:4k:1 randwrite:4k:32 randwrite:4k:128 randread:128k:32"
  OUT=bench-out/peers-<timestamp>  IOPACE=target/release/iopace  FILE_DIR=/var/tmp
  IOPACE_BINS="main=/path/a new=/path/b": "iopace-KIND+TAG" runs binary TAG, so
          two builds alternate in one run (untagged names run IOPACE)
  RAMP=0  seconds of fio --ramp_time before each point; the server's CPU is
          sampled RAMP s after fio starts, so it covers (about) the IOs fio counts
  LOCK=/path  take an exclusive flock on this file for each repetition (not
          the whole run), so other timed work can run between repetitions

Beside the server's CPU per IO each run records fio's own CPU (usr+sys % of
one CPU, from its JSON), the server's CPU as % of one CPU, and the machine's
busy % of all CPUs from /proc/stat over the measured window (results.json).
Only the 128 KiB reads, for example:
  JOBS=randread:128k:32 REPS=7 RUNTIME=15 RAMP=3 LOCK=/work/wt/bench.lock python3 scripts/peers.py
"""
import fcntl
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IOPACE = os.environ.get("IOPACE", os.path.join(ROOT, "target/release/iopace"))
REPS = int(os.environ.get("REPS", "3"))
RUNTIME = int(os.environ.get("RUNTIME", "5"))
RAMP = int(os.environ.get("RAMP", "0"))
LOCK = os.environ.get("LOCK", "")
SIZE = os.environ.get("SIZE", "256m")
SERVERS = os.environ.get("SERVERS", "iopace-malloc iopace-null nbdkit-memory qemu-nbd-null").split()
TRANSPORTS = os.environ.get("TRANSPORTS", "unix tcp").split()
JOBS = os.environ.get(
    "JOBS",
    "randread:4k:1 randread:4k:32 randread:4k:128 randwrite:4k:1 randwrite:4k:32 randwrite:4k:128 randread:128k:32",
).split()
FILE_DIR = os.environ.get("FILE_DIR", "/var/tmp")
BINS = dict(kv.split("=", 1) for kv in os.environ.get("IOPACE_BINS", "").split() if "=" in kv)
OUT = os.environ.get("OUT", os.path.join(ROOT, "bench-out", time.strftime("peers-%Y%m%d-%H%M%S")))
CLK = os.sysconf("SC_CLK_TCK")


def need(tool, package):
    if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
        sys.exit(f"peers: `{tool}` is missing: apt-get install {package}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def machine_ticks():
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]  # idle + iowait
    return sum(vals[:8]) - idle, sum(vals[:8])


class Server:
    """One peer server on one transport; `uri` is what fio connects to."""

    count = 0

    def __init__(self, name, transport, work):
        self.name, self.transport, self.work = name, transport, work
        Server.count += 1
        self.file = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        self.sock = os.path.join(work, f"{self.file}-{transport}-{Server.count}.sock")
        self.port = free_port()
        self.export = ""
        self.proc = None
        self.img = None

    def argv(self):
        listen_nbdkit = ["-U", self.sock] if self.transport == "unix" else ["-i", "127.0.0.1", "-p", str(self.port)]
        listen_qemu = ["-k", self.sock] if self.transport == "unix" else ["-b", "127.0.0.1", "-p", str(self.port)]
        # "iopace-KIND@k=v,k=v" adds TOML lines to iopace's [server] table,
        # so server settings compare inside one run.
        base, _, extra = self.name.partition("@")
        base, _, tag = base.partition("+")
        binary = BINS[tag] if tag else IOPACE
        kind = base.split("-", 1)[1] if base.startswith("iopace") else base.rsplit("-", 1)[1]
        if kind == "file":
            self.img = os.path.join(FILE_DIR, f"iopace-peers-{self.name}.img")
            with open(self.img, "ab") as f:
                f.truncate(1 << 30)
        if self.name.startswith("iopace"):
            cfg = os.path.join(self.work, f"{self.file}.toml")
            bdev = {
                "malloc": 'kind = "malloc"\nsize = "1GiB"',
                "null": 'kind = "null"\nsize = "1GiB"',
                "file": f'kind = "file"\npath = "{self.img}"',
            }[kind]
            tcp = f'["127.0.0.1:{self.port}"]' if self.transport == "tcp" else "[]"
            unix = f'["{self.sock}"]' if self.transport == "unix" else "[]"
            with open(cfg, "w") as f:
                f.write(
                    f'[server]\ntcp = {tcp}\nunix = {unix}\nrpc = "{self.sock}.rpc"\n'
                    + "".join(f"{kv}\n" for kv in extra.split(",") if kv)
                    + f'[[bdev]]\nname = "d"\n{bdev}\n[[export]]\nname = "bench"\nbdev = "d"\n'
                )
            self.export = "bench"
            return [binary, "serve", "--config", cfg]
        if self.name.startswith("nbdkit"):
            plugin = ["memory", "1G"] if kind == "memory" else ["file", self.img, "cache=none"]
            return ["nbdkit", "-f", "--exit-with-parent", *listen_nbdkit, *plugin]
        if self.name.startswith("qemu-nbd"):
            if kind == "null":
                image = ["--image-opts", "driver=null-co,size=1G,read-zeroes=off"]
            else:
                image = ["-f", "raw", "--cache=none", "--aio=io_uring", self.img]
            return ["qemu-nbd", "-t", "-e", "8", *listen_qemu, *image]
        raise SystemExit(f"peers: unknown server {self.name}")

    @property
    def uri(self):
        if self.transport == "unix":
            return f"nbd+unix:///{self.export}?socket={self.sock}"
        return f"nbd://127.0.0.1:{self.port}/{self.export}"

    def start(self):
        argv = self.argv()
        self.log = open(os.path.join(self.work, f"{self.file}-{self.transport}.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"peers: {argv} exited: see {self.log.name}")
            try:
                if self.transport == "unix":
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(self.sock)
                else:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        # Non-zero data everywhere fio reads, so nobody can answer with holes.
        fio(self.uri, "write", "1m", 8, runtime=None, size=SIZE, extra=["--buffer_pattern=0x5a"])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def fio(uri, rw, bs, qd, runtime, size=SIZE, extra=(), at_ramp=None):
    argv = [
        "fio", "--name=peer", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
        f"--iodepth={qd}", f"--size={size}", "--output-format=json", *extra,
    ]
    if runtime:
        argv += ["--time_based", f"--runtime={runtime}"]
    if runtime and RAMP:
        argv += [f"--ramp_time={RAMP}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if at_ramp:
        time.sleep(RAMP if runtime else 0)
        at_ramp()
    stdout, stderr = proc.communicate(timeout=(runtime or 60) + RAMP + 60)
    if proc.returncode != 0:
        raise SystemExit(f"peers: fio failed: {' '.join(argv)}\n{stderr}")
    text = stdout
    return json.loads(text[text.index("{"):])


def measure(server, job):
    rw, bs, qd = job.split(":")
    # Without RAMP the CPU counter covers exactly the IOs fio counts; with
    # it, sampling starts RAMP s after fio's launch (its start-up, ~tens of
    # ms, falls inside the ramp).
    t0 = {}

    def sample():
        t0.update(cpu=cpu_ticks(server.proc.pid), machine=machine_ticks(), wall=time.time())

    if not RAMP:
        sample()
    res = fio(server.uri, rw, bs, int(qd), RUNTIME, at_ramp=sample if RAMP else None)
    t1 = cpu_ticks(server.proc.pid)
    busy1, total1 = machine_ticks()
    wall = time.time() - t0["wall"]
    job0 = res["jobs"][0]
    side = job0["read" if "read" in rw else "write"]
    ios = side["total_ios"]
    cpu_us = (t1 - t0["cpu"]) / CLK * 1e6
    busy0, total0 = t0["machine"]
    return {
        "server_cpu_pct": cpu_us / 1e6 / wall * 100,
        "fio_cpu_pct": job0["usr_cpu"] + job0["sys_cpu"],
        "machine_busy_pct": (busy1 - busy0) / max(total1 - total0, 1) * 100,
        "iops": side["iops"],
        "mibs": side["bw"] / 1024,
        "avg_us": side["lat_ns"]["mean"] / 1000,
        "p99_us": side["clat_ns"]["percentile"]["99.000000"] / 1000,
        "cpu_us_per_io": cpu_us / ios if ios else 0.0,
        "ios": ios,
    }


def main():
    need("fio", "fio")
    for s in SERVERS:
        if s.startswith("nbdkit"):
            need("nbdkit", "nbdkit")
        if s.startswith("qemu-nbd"):
            need("qemu-nbd", "qemu-utils")
        tag = s.partition("@")[0].partition("+")[2]
        if s.startswith("iopace") and tag and tag not in BINS:
            sys.exit(f"peers: {s}: no binary tagged {tag} in IOPACE_BINS")
        if s.startswith("iopace") and not tag and not os.path.exists(IOPACE):
            sys.exit(f"peers: {IOPACE} not built: run `make release`")
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="iopace-peers-")
    results = {}  # (server, transport, job) -> [runs]
    started = []
    try:
        for rep in range(REPS):
            order = SERVERS if rep % 2 == 0 else list(reversed(SERVERS))
            lock = open(LOCK, "a") if LOCK else None
            if lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                print(f"rep {rep + 1}/{REPS} lock taken {time.strftime('%H:%M:%S')} "
                      f"load {open('/proc/loadavg').read().strip()}", flush=True)
            for transport in TRANSPORTS:
                for name in order:
                    srv = Server(name, transport, work)
                    started.append(srv)
                    srv.start()
                    for job in JOBS:
                        r = measure(srv, job)
                        results.setdefault((name, transport, job), []).append(r)
                        save(results)
                        print(f"rep {rep + 1}/{REPS} {transport:4} {name:14} {job:16} "
                              f"{r['iops']:9.0f} IOPS {r['mibs']:8.1f} MiB/s avg {r['avg_us']:7.1f} us "
                              f"p99 {r['p99_us']:7.1f} us cpu/io {r['cpu_us_per_io']:5.2f} us "
                              f"srv {r['server_cpu_pct']:3.0f}% fio {r['fio_cpu_pct']:3.0f}% "
                              f"all {r['machine_busy_pct']:3.0f}%", flush=True)
                    srv.stop()
            if lock:
                print(f"rep {rep + 1}/{REPS} lock released {time.strftime('%H:%M:%S')} "
                      f"load {open('/proc/loadavg').read().strip()}", flush=True)
                lock.close()
    finally:
        for s in started:
            if s.proc and s.proc.poll() is None:
                s.stop()
    save(results)
    table = render(results)
    with open(os.path.join(OUT, "table.md"), "w") as f:
        f.write(table)
    print()
    print(table)
    print(f"raw results: {OUT}/results.json")


def save(results):
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump([{"server": k[0], "transport": k[1], "job": k[2], "runs": v} for k, v in results.items()], f, indent=1)


def render(results):
    def cell(runs, key, fmt):
        vals = [r[key] for r in runs]
        med = statistics.median(vals)
        return f"{fmt.format(med)} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"

    lines = [
        f"Median of {REPS} runs (min–max); {RUNTIME} s per point"
        + (f" after a {RAMP} s ramp" if RAMP else "") + "; fio nbd engine, one connection.",
        "",
        "| transport | job | server | IOPS | MiB/s | avg lat, us | p99, us | server CPU/IO, us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for transport in TRANSPORTS:
        for job in JOBS:
            for name in SERVERS:
                runs = results.get((name, transport, job))
                if not runs:
                    continue
                rw, bs, qd = job.split(":")
                lines.append(
                    f"| {transport} | {rw} {bs} QD{qd} | {name} | "
                    f"{cell(runs, 'iops', '{:.0f}')} | {cell(runs, 'mibs', '{:.0f}')} | "
                    f"{cell(runs, 'avg_us', '{:.1f}')} | {cell(runs, 'p99_us', '{:.1f}')} | "
                    f"{cell(runs, 'cpu_us_per_io', '{:.2f}')} |"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
