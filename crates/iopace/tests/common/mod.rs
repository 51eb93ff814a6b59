//! Shared helpers for the integration tests: start the real `iopace` binary
//! on private sockets, run real clients against it, read its stats.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub mod nvme;

pub const BIN: &str = env!("CARGO_BIN_EXE_iopace");

/// Fails the test (not skips it) when a client is missing.
pub fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is missing: apt-get install {package} (or run scripts/setup.sh)"
    );
}

/// A port free now, below Linux's ephemeral range (32768-60999 by
/// default): a port the kernel picked as ephemeral could be taken as the
/// source port of another test's client before the server bound it
/// ("Address already in use" in `make test`).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread the tests of each binary (a process) over the range.
    let base = std::process::id() * 7919;
    for _ in 0..1000 {
        let n = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 104_729);
        let port = 20_000 + (n % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub rpc: PathBuf,
    pub port: u16,
    pub log: PathBuf,
}

/// Bdevs and exports used when a test does not bring its own.
pub const MALLOC_EXPORTS: &str = r#"
[[bdev]]
name = "m0"
kind = "malloc"
size = "512MiB"

[[bdev]]
name = "ro0"
kind = "malloc"
size = "16MiB"

[[export]]
name = "default"
bdev = "m0"

[[export]]
name = "ro"
bdev = "ro0"
read_only = true
"#;

impl Server {
    /// Starts `iopace serve` with `body` (bdev and export sections) and the
    /// given buffer settings, on private sockets.
    pub fn start_with(body: &str, buffers: &str) -> Server {
        Server::start_full("", body, buffers)
    }

    /// As [`Server::start_with`], with `server_extra` lines added to `[server]`.
    pub fn start_full(server_extra: &str, body: &str, buffers: &str) -> Server {
        let port = free_port();
        let tcp = format!("[\"127.0.0.1:{port}\"]");
        Server::start_listening(&tcp, port, server_extra, body, buffers)
    }

    /// As [`Server::start_full`], with `tcp` as `[server] tcp` (TOML), which
    /// must listen on 127.0.0.1:`port` (the server is ready when it does).
    pub fn start_listening(
        tcp: &str,
        port: u16,
        server_extra: &str,
        body: &str,
        buffers: &str,
    ) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("iopace-it")
            .tempdir()
            .expect("tempdir");
        let sock = dir.path().join("nbd.sock");
        let rpc = dir.path().join("admin.sock");
        let config = format!(
            "[server]\nreactors = 2\ntcp = {tcp}\nunix = [\"{}\"]\nrpc = \"{}\"\n{server_extra}\n\n[buffers]\n{buffers}\n{body}",
            sock.display(),
            rpc.display()
        );
        let cfg_path = dir.path().join("iopace.toml");
        std::fs::write(&cfg_path, config).expect("write config");
        let log = dir.path().join("serve.log");
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn iopace");
        let mut s = Server {
            child: Some(child),
            dir,
            sock,
            rpc,
            port,
            log,
        };
        s.wait_ready();
        s
    }

    pub fn start(body: &str) -> Server {
        Server::start_with(body, "num_shared_buffers = 256\nbuf_cache_size = 8")
    }

    pub fn malloc() -> Server {
        Server::start(MALLOC_EXPORTS)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("iopace exited early with {st}:\n{}", self.log_text());
            }
            if UnixStream::connect(&self.rpc).is_ok()
                && TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("iopace did not become ready:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    /// One JSON-RPC call with `params` on the admin socket: its whole reply
    /// (`result` or `error`).
    pub fn rpc_call(&self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let mut s = UnixStream::connect(&self.rpc).expect("connect admin socket");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let call =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        writeln!(s, "{call}").expect("write rpc");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).expect("read rpc");
        serde_json::from_str(&line).expect("rpc reply is JSON")
    }

    /// One JSON-RPC call on the admin socket.
    pub fn rpc(&self, method: &str) -> serde_json::Value {
        let mut s = UnixStream::connect(&self.rpc).expect("connect admin socket");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        writeln!(
            s,
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"{method}\"}}"
        )
        .expect("write rpc");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).expect("read rpc");
        let v: serde_json::Value = serde_json::from_str(&line).expect("rpc reply is JSON");
        v["result"].clone()
    }

    /// Buffers held by requests across reactors, and free in the pool.
    pub fn buffers(&self) -> (u64, u64) {
        let stats = self.rpc("get_stats");
        let reactors = stats["reactors"]
            .as_array()
            .expect("reactors array")
            .clone();
        let in_use = reactors
            .iter()
            .map(|r| r["buffers"]["in_use"].as_u64().unwrap_or(0))
            .sum();
        let free = reactors
            .first()
            .map_or(0, |r| r["buffers"]["pool_free"].as_u64().unwrap_or(0));
        (in_use, free)
    }

    /// Waits until every buffer is back in the pool and no request is in flight.
    pub fn assert_quiescent(&self, total: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.rpc("get_stats");
            let reactors = stats["reactors"].as_array().expect("reactors").clone();
            let in_flight: u64 = reactors
                .iter()
                .map(|r| r["requests_in_flight"].as_u64().unwrap_or(0))
                .sum();
            let (in_use, free) = self.buffers();
            // The pool holds `total` large buffers and its small ones.
            let pool_total = reactors
                .first()
                .map_or(0, |r| r["buffers"]["pool_total"].as_u64().unwrap_or(0));
            assert!(
                pool_total >= total,
                "pool of {pool_total}, {total} large expected"
            );
            if in_use == 0 && free == pool_total && in_flight == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not quiescent: in_use {in_use}, free {free}/{total}, in flight {in_flight}\n{stats:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and wait; returns the exit status and the server's log.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child by its PID.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return (st, self.log_text());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("iopace did not stop on SIGTERM:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A temporary file in `dir` (its filesystem matters to some tests), and
/// a config body serving it as file bdev "f0" of `size` under export
/// "default".
pub fn file_export(prefix: &str, dir: &str, size: &str) -> (tempfile::NamedTempFile, String) {
    let img = tempfile::Builder::new()
        .prefix(prefix)
        .tempfile_in(dir)
        .expect("temp file");
    let body = format!(
        "[[bdev]]\nname = \"f0\"\nkind = \"file\"\npath = \"{}\"\nsize = \"{size}\"\n\n\
         [[export]]\nname = \"default\"\nbdev = \"f0\"\n",
        img.path().display()
    );
    (img, body)
}

/// The bytes an unprivileged writer may still allocate under `dir`.
pub fn free_bytes(dir: &str) -> u64 {
    let path = std::ffi::CString::new(dir).expect("path");
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs {dir}");
    st.f_bavail as u64 * st.f_frsize as u64
}

/// Runs `iopace serve ARGS` to completion (it must fail or be --check) with a time limit.
pub fn serve_once(args: &[&str], config: &str, dir: &Path) -> Output {
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, config).expect("write config");
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn iopace");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("iopace serve {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// qemu-io's commands on `uri` as a raw image, within `limit`: its stdout
/// and stderr. Panics if qemu-io fails (a command that fails makes it exit 1).
pub fn qemu_io(uri: &str, cmds: &[&str], limit: Duration) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = run(c.arg(uri), limit);
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs a client with a time limit; panics with its output on failure.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{desc}: {e}"));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{desc} timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = Output {
        status,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    };
    assert!(
        output.status.success(),
        "{desc} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Writes `len` bytes of deterministic pseudo-random data to `path`.
/// The buffer pool as the server's exit log reports it: (free, total).
pub fn pool_at_exit(log: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        let at = log.find(name).map(|i| &log[i + name.len()..]);
        at.and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    (field("free_buffers="), field("total="))
}

pub fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut data = vec![0u8; len];
    for chunk in data.chunks_mut(8) {
        // xorshift64: fast, deterministic, incompressible enough.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    std::fs::write(path, data).expect("write random file");
}

/// A raw NBD client for hostile-input tests: fixed newstyle, NO_ZEROES, GO.
pub struct RawClient<S: Read + Write> {
    pub s: S,
}

pub const REQ_MAGIC: u32 = 0x2560_9513;

impl<S: Read + Write> RawClient<S> {
    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).expect("read from server");
        v
    }

    /// Reads the greeting and sends client flags.
    pub fn greet(&mut self) {
        let g = self.read_exact(18);
        assert_eq!(&g[..8], b"NBDMAGIC");
        self.s.write_all(&3u32.to_be_bytes()).expect("flags");
    }

    pub fn option(&mut self, opt: u32, data: &[u8]) {
        let mut m = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m).expect("option");
    }

    /// Reads one option reply: (option, type, data).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self.read_exact(20);
        let opt = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let typ = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]) as usize;
        (opt, typ, self.read_exact(len))
    }

    /// NBD_OPT_GO for `export`; returns its size.
    pub fn go(&mut self, export: &str) -> u64 {
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(7, &d);
        let mut size = 0;
        loop {
            let (_, typ, data) = self.option_reply();
            match typ {
                3 if data.len() >= 12 && data[..2] == [0, 0] => {
                    size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                }
                3 => {}
                1 => return size,
                other => panic!("GO failed with reply type {other:#x}"),
            }
        }
    }

    pub fn request(&mut self, cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        let mut m = REQ_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&cmd.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        self.s.write_all(&m).expect("request");
    }

    /// Reads a simple reply: (error, cookie).
    pub fn simple_reply(&mut self) -> (u32, u64) {
        let r = self.read_exact(16);
        assert_eq!(
            u32::from_be_bytes([r[0], r[1], r[2], r[3]]),
            0x6744_6698,
            "simple reply magic"
        );
        (
            u32::from_be_bytes([r[4], r[5], r[6], r[7]]),
            u64::from_be_bytes(r[8..16].try_into().expect("8 bytes")),
        )
    }
}

/// A socket whose reads and writes can be given a time limit.
pub trait Bounded: Read + Write {
    fn bound(&self, limit: Duration);
}

impl Bounded for UnixStream {
    fn bound(&self, limit: Duration) {
        self.set_read_timeout(Some(limit)).expect("timeout");
        self.set_write_timeout(Some(limit)).expect("timeout");
    }
}

impl Bounded for TcpStream {
    fn bound(&self, limit: Duration) {
        self.set_read_timeout(Some(limit)).expect("timeout");
        self.set_write_timeout(Some(limit)).expect("timeout");
    }
}

/// A raw client on `s`, greeted: its options come next.
fn greeted<S: Bounded>(s: S) -> RawClient<S> {
    // A stuck server fails the test instead of hanging it.
    s.bound(Duration::from_secs(10));
    let mut c = RawClient { s };
    c.greet();
    c
}

/// A raw client on `s`, through the handshake into `export`.
fn raw<S: Bounded>(s: S, export: &str) -> RawClient<S> {
    let mut c = greeted(s);
    c.go(export);
    c
}

/// A raw TCP client of the server on 127.0.0.1:`port`, greeted.
pub fn greeted_tcp(port: u16) -> RawClient<TcpStream> {
    greeted(TcpStream::connect(("127.0.0.1", port)).expect("connect"))
}

pub fn raw_unix(server: &Server, export: &str) -> RawClient<UnixStream> {
    raw(UnixStream::connect(&server.sock).expect("connect"), export)
}

pub fn raw_tcp(server: &Server, export: &str) -> RawClient<TcpStream> {
    raw(
        TcpStream::connect(("127.0.0.1", server.port)).expect("connect"),
        export,
    )
}

/// A full write-then-read check through a fresh raw connection.
pub fn roundtrip_ok(server: &Server) {
    let mut c = raw_unix(server, "default");
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    c.request(1, 0, 77, 1 << 20, 4096);
    c.s.write_all(&data).expect("payload");
    assert_eq!(c.simple_reply(), (0, 77));
    c.request(0, 0, 78, 1 << 20, 4096);
    assert_eq!(c.simple_reply(), (0, 78));
    assert_eq!(c.read_exact(4096), data);
}

/// One write and one read through `server`, then its `iopace stats` report.
pub fn stats_after_roundtrip(server: &Server) -> String {
    roundtrip_ok(server);
    let out = Command::new(BIN)
        .args(["stats", "--rpc"])
        .arg(&server.rpc)
        .output()
        .expect("iopace stats");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text
}

/// A `model` bdev for the probe tests: its cost model (the TOML inline
/// table's body), latency, channels and knee.
#[derive(Clone, Copy)]
pub struct ModelShape<'a> {
    pub name: &'a str,
    pub cost: &'a str,
    pub latency_us: u32,
    pub channels: u32,
    pub knee_qd: u32,
    pub knee_us: u32,
}

/// A shape from its name, cost, latency (us), channels, knee QD and knee
/// (us per IO past it).
pub const fn model(
    name: &'static str,
    cost: &'static str,
    latency_us: u32,
    channels: u32,
    knee_qd: u32,
    knee_us: u32,
) -> ModelShape<'static> {
    ModelShape {
        name,
        cost,
        latency_us,
        channels,
        knee_qd,
        knee_us,
    }
}

/// Writes `dir/file`: a null base and one `model` bdev and export per
/// shape; returns its path.
pub fn model_config(dir: &Path, file: &str, shapes: &[ModelShape]) -> std::path::PathBuf {
    let mut text = String::from("[[bdev]]\nname = \"base\"\nkind = \"null\"\nsize = \"8GiB\"\n\n");
    for m in shapes {
        text += &format!(
            "[[bdev]]\nname = \"{}\"\nkind = \"model\"\nbase = \"base\"\ncost = {{ {} }}\n\
             latency_us = {}\nchannels = {}\nknee_qd = {}\nknee_us = {}\n\n\
             [[export]]\nname = \"{}\"\nbdev = \"{}\"\n\n",
            m.name, m.cost, m.latency_us, m.channels, m.knee_qd, m.knee_us, m.name, m.name
        );
    }
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write config");
    path
}

/// The six cost parameters of a shape's `cost` text, by name.
pub fn cost_truth(cost: &str) -> Vec<(String, f64)> {
    cost.split(", ")
        .map(|kv| {
            let (k, v) = kv.split_once(" = ").expect("k = v");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect()
}

/// A client process killed and reaped when dropped, so a failing test
/// leaves no client running after it (fio with a long `--runtime` once
/// outlived a panicked test by an hour).
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
