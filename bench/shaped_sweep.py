#!/usr/bin/env python3
"""Real-target pacing validation on a shaped wire.

Initiator hosts are network namespaces joined to the target by veth pairs
shaped with tc tbf (scripts/wire.sh), so the wire is slower than the bdevs.
For each pacing mode and total queue depth, fio (nbd engine) runs 128 KiB
random reads from every host; the target's stats are sampled over its admin
socket during the run. Prints and writes the seed's sweep table.

Needs root (namespaces). Knobs (environment):
  HOSTS=1 RATE=2gbit MODES="none buffers rate auto" QDS="8 16 32 64 128 256 512 1024"
  RUNTIME=6 BS=128k EXPORTS=default (comma list: one fio job per export per host)
  OUT=docs/results/shaped-<hosts>h-<rate>.md  IOPACE=target/release/iopace
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IOPACE = os.environ.get("IOPACE", os.path.join(ROOT, "target/release/iopace"))
HOSTS = int(os.environ.get("HOSTS", "1"))
RATE = os.environ.get("RATE", "2gbit")
MODES = os.environ.get("MODES", "none buffers rate auto").split()
QDS = [int(q) for q in os.environ.get("QDS", "8 16 32 64 128 256 512 1024").split()]
RUNTIME = int(os.environ.get("RUNTIME", "6"))
BS = os.environ.get("BS", "128k")
EXPORTS = os.environ.get("EXPORTS", "default").split(",")
OUT = os.environ.get("OUT", os.path.join(ROOT, "docs/results", f"shaped-{HOSTS}h-{RATE}.md"))
WIRE = os.path.join(ROOT, "scripts/wire.sh")


def rate_bps(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * m
    return float(rate)


LINK = rate_bps(RATE) * HOSTS  # bits/s across all hosts
BS_BYTES = int(BS[:-1]) * 1024 if BS.endswith("k") else int(BS)


def config(mode, work):
    """The target config for a mode: the seed's methods with settings for this wire."""
    tcp = ", ".join(f'"10.77.{i}.1:10809"' for i in range(1, HOSTS + 1))
    buffers = "num_shared_buffers = 8192\nbuf_cache_size = 32"
    pacing = f'mode = "{mode}"'
    if mode == "buffers":
        # Method 1: a small pool holds the wire's bandwidth-delay product.
        buffers = "num_shared_buffers = 64\nbuf_cache_size = 8"
    if mode == "rate":
        # Method 2: one buffer of credit per period at the wire's rate.
        period = BS_BYTES * 8 / LINK * 1e6
        pacing += f"\nperiod_us = {period:.2f}\ncredit = {BS_BYTES}"
    bdevs = (
        '[[bdev]]\nname = "m0"\nkind = "malloc"\nsize = "2GiB"\n'
        '[[bdev]]\nname = "m1"\nkind = "malloc"\nsize = "1GiB"\n'
        '[[bdev]]\nname = "slow"\nkind = "delay"\nbase = "m1"\nread_avg_us = 1000\nwrite_avg_us = 1000\n'
        '[[export]]\nname = "default"\nbdev = "m0"\n'
        '[[export]]\nname = "slow"\nbdev = "slow"\n'
    )
    text = (
        f'[server]\nreactors = 2\ntcp = [{tcp}]\nunix = []\nrpc = "{work}/admin.sock"\n'
        f"max_requests_per_reactor = 8192\n[buffers]\n{buffers}\n[pacing]\n{pacing}\n{bdevs}"
    )
    path = os.path.join(work, f"{mode}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def rpc(path, method):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return json.loads(data)["result"]


def tx_bytes():
    total = 0
    for i in range(1, HOSTS + 1):
        with open(f"/sys/class/net/ipw{i}t/statistics/tx_bytes") as f:
            total += int(f.read())
    return total


class Sampler(threading.Thread):
    """Samples buffers in use and the pacer's period while fio runs."""

    def __init__(self, rpc_path, buffer_size):
        super().__init__(daemon=True)
        self.rpc_path, self.buffer_size = rpc_path, buffer_size
        self.samples, self.periods, self.stop = [], [], False

    def run(self):
        while not self.stop:
            try:
                st = rpc(self.rpc_path, "get_stats")
                bufs = sum(r["buffers"]["in_use"] for r in st["reactors"])
                self.samples.append(bufs * self.buffer_size / 2**20)
                periods = [r["pacer"].get("period_us", 0) for r in st["reactors"] if r["pacer"].get("ios", 0) > 0]
                if periods:
                    self.periods.append(sum(periods) / len(periods))
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.25)


def run_point(qd, rpc_path, buffer_size):
    per = max(1, qd // (HOSTS * len(EXPORTS)))
    procs = []
    for i in range(1, HOSTS + 1):
        for e in EXPORTS:
            argv = [
                "ip", "netns", "exec", f"iopace-h{i}", "fio", f"--name=h{i}-{e}", "--ioengine=nbd",
                f"--uri=nbd://10.77.{i}.1:10809/{e}", "--rw=randread", f"--bs={BS}", f"--iodepth={per}",
                "--size=1g", "--time_based", f"--runtime={RUNTIME}", "--ramp_time=1", "--output-format=json",
            ]
            procs.append((i, e, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    time.sleep(1)  # ramp
    sampler = Sampler(rpc_path, buffer_size)
    t0, b0 = time.time(), tx_bytes()
    sampler.start()
    results = []
    for i, e, p in procs:
        out, err = p.communicate(timeout=RUNTIME + 60)
        if p.returncode != 0:
            sys.exit(f"shaped: fio failed on host {i}: {err}")
        results.append((i, e, json.loads(out[out.index("{"):])))
    t1, b1 = time.time(), tx_bytes()
    sampler.stop = True
    sampler.join()
    bw = sum(r["jobs"][0]["read"]["bw_bytes"] for _, _, r in results) * 8 / 1e9
    ios = sum(r["jobs"][0]["read"]["total_ios"] for _, _, r in results)
    lat = sum(r["jobs"][0]["read"]["lat_ns"]["mean"] * r["jobs"][0]["read"]["total_ios"] for _, _, r in results) / max(ios, 1)
    p99 = max(r["jobs"][0]["read"]["clat_ns"]["percentile"]["99.000000"] for _, _, r in results)
    sd = (sum((r["jobs"][0]["read"]["bw_dev"] * 8 * 1024 / 1e9) ** 2 for _, _, r in results) / len(results)) ** 0.5
    per_export = {}
    for _, e, r in results:
        per_export[e] = per_export.get(e, 0) + r["jobs"][0]["read"]["bw_bytes"] * 8 / 1e9
    s = sampler.samples or [0]
    return {
        "qd": qd, "bw": bw, "wire": (b1 - b0) * 8 / (t1 - t0) / 1e9, "lat_us": lat / 1000, "p99_us": p99 / 1000,
        "bw_stddev": sd, "bufs_avg": sum(s) / len(s), "bufs_max": max(s),
        "period_us": (sum(sampler.periods) / len(sampler.periods)) if sampler.periods else 0.0,
        "per_export": per_export,
    }


def main():
    if os.geteuid() != 0:
        sys.exit("shaped: needs root for network namespaces")
    for tool, pkg in [("fio", "fio"), ("ip", "iproute2"), ("tc", "iproute2")]:
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            sys.exit(f"shaped: `{tool}` is missing: apt-get install {pkg}")
    if not os.path.exists(IOPACE):
        sys.exit(f"shaped: {IOPACE} not built: run `make release`")
    work = tempfile.mkdtemp(prefix="iopace-shaped-")
    subprocess.run([WIRE, "up", str(HOSTS), RATE], check=True)
    rows = {}
    try:
        for mode in MODES:
            cfg = config(mode, work)
            log = open(os.path.join(work, f"{mode}.log"), "w")
            srv = subprocess.Popen([IOPACE, "serve", "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
            try:
                for _ in range(200):
                    if os.path.exists(f"{work}/admin.sock"):
                        break
                    time.sleep(0.05)
                buffer_size = rpc(f"{work}/admin.sock", "get_config")["buffers"]["buffer_size"]
                for qd in QDS:
                    r = run_point(qd, f"{work}/admin.sock", buffer_size)
                    rows.setdefault(mode, []).append(r)
                    extra = " ".join(f"{k}={v:.2f}" for k, v in r["per_export"].items()) if len(EXPORTS) > 1 else ""
                    print(f"{mode:8} QD {qd:5} BW {r['bw']:6.3f} Gb/s wire {r['wire']:6.3f} lat {r['lat_us']:9.1f} us "
                          f"p99 {r['p99_us']:9.1f} bufs {r['bufs_avg']:7.2f} ({r['bufs_max']:.2f}) MiB "
                          f"period {r['period_us']:.1f} {extra}", flush=True)
            finally:
                srv.terminate()
                srv.wait(timeout=30)
                log.close()
    finally:
        subprocess.run([WIRE, "down", str(HOSTS)])
    write(rows)


def write(rows):
    lines = [
        f"# Pacing on a shaped wire: {HOSTS} host(s) x {RATE}, {BS} random reads",
        "",
        "Produced by:",
        "",
        "```sh",
        f"sudo HOSTS={HOSTS} RATE={RATE} MODES=\"{' '.join(MODES)}\" QDS=\"{' '.join(map(str, QDS))}\" "
        f"RUNTIME={RUNTIME} EXPORTS={','.join(EXPORTS)} bench/shaped_sweep.py",
        "```",
        "",
        f"Wire: {HOSTS} veth pair(s) shaped with tc tbf at {RATE} each ({LINK / 1e9:.1f} Gb/s total). "
        "Target: malloc bdev (1 ms delay bdev for `slow`), 2 reactors, fio nbd engine in each namespace. "
        "Bufs in-flight: target data buffers held, sampled every 250 ms (average and max). "
        "BW STDDEV: root mean square of the hosts' fio bw_dev. "
        f"Run on {time.strftime('%Y-%m-%d')}, 2-core VM.",
        "",
    ]
    for mode, rs in rows.items():
        lines += [
            f"## mode `{mode}`",
            "",
            "| QD | BW, Gb/s | WIRE BW, Gb/s | AVG LAT, us | p99, us | BW STDDEV | Bufs in-flight (MiB) | Pacer period, us |"
            + (" per export, Gb/s |" if len(EXPORTS) > 1 else ""),
            "|---|---|---|---|---|---|---|---|" + ("---|" if len(EXPORTS) > 1 else ""),
        ]
        for r in rs:
            extra = (" " + ", ".join(f"{k} {v:.2f}" for k, v in r["per_export"].items()) + " |") if len(EXPORTS) > 1 else ""
            lines.append(
                f"| {r['qd']} | {r['bw']:.3f} | {r['wire']:.3f} | {r['lat_us']:.1f} | {r['p99_us']:.1f} | "
                f"{r['bw_stddev']:.3f} | {r['bufs_avg']:.2f} ({r['bufs_max']:.2f}) | {r['period_us']:.1f} |{extra}"
            )
        lines.append("")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
