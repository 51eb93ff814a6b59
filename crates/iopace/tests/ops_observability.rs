//! What an operator watches: the metrics endpoint (parsed by a Prometheus
//! text-format parser), JSON logs with connection lifecycle, `iopace stats`
//! totals and per-export rows.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// One HTTP GET on loopback; returns (status line, body).
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("HTTP reply");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

fn sample(scrape: &prometheus_parse::Scrape, name: &str, label: (&str, &str)) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && s.labels.get(label.0) == Some(label.1))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

const BUFFERS: &str = "num_shared_buffers = 256\nbuf_cache_size = 8";

#[test]
fn metrics_endpoint_parses_and_counts_io() {
    let port = free_port();
    let server = Server::start_full(
        &format!("metrics = \"127.0.0.1:{port}\""),
        MALLOC_EXPORTS,
        BUFFERS,
    );
    roundtrip_ok(&server);
    let (status, body) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text parses");
    assert_eq!(
        sample(&scrape, "iopace_export_ios_total", ("export", "default")),
        2.0,
        "{body}"
    );
    assert_eq!(
        sample(&scrape, "iopace_export_bytes_total", ("export", "default")),
        8192.0,
        "{body}"
    );
    let histogram = scrape
        .samples
        .iter()
        .find(|s| s.metric == "iopace_export_latency_seconds")
        .expect("latency histogram");
    assert!(matches!(
        histogram.value,
        prometheus_parse::Value::Histogram(_)
    ));
    assert!(
        body.contains("iopace_pacer_window_bytes{reactor=\"0\"}"),
        "{body}"
    );
    let (status, _) = http_get(port, "/nope");
    assert!(status.contains("404"), "{status}");
    let (code, log) = server.stop();
    assert!(code.success(), "{log}");
}

#[test]
fn json_logs_show_connection_lifecycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[server]\nreactors = 1\ntcp = [\"127.0.0.1:{port}\"]\nunix = []\nrpc = \"\"\n{MALLOC_EXPORTS}"),
    )
    .expect("write");
    let log = dir.path().join("log");
    let mut child = Command::new(BIN)
        .args(["serve", "--log-format", "json", "--config"])
        .arg(&cfg)
        .env("IOPACE_LOG", "debug")
        .stderr(std::fs::File::create(&log).expect("log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "not serving");
        std::thread::sleep(Duration::from_millis(20));
    }
    // One client that reads 4 KiB and says NBD_CMD_DISC, one that just goes.
    let mut c = RawClient {
        s: TcpStream::connect(("127.0.0.1", port)).expect("connect"),
    };
    c.greet();
    c.go("default");
    c.request(0, 0, 1, 0, 4096);
    assert_eq!(c.simple_reply().0, 0);
    c.read_exact(4096);
    c.request(2, 0, 2, 0, 0);
    drop(c);
    drop(TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child by its PID.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().expect("wait").success());
    let text = std::fs::read_to_string(&log).expect("log");
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    let accepted = events
        .iter()
        .find(|e| e["fields"]["message"] == "accepted a connection")
        .unwrap_or_else(|| panic!("no accept event: {text}"));
    assert!(
        accepted["fields"]["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{accepted}"
    );
    assert_eq!(accepted["level"], "INFO");
    let closed: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["fields"]["message"] == "connection closed")
        .collect();
    let served = closed
        .iter()
        .find(|e| e["fields"]["export"] == "default")
        .unwrap_or_else(|| panic!("no close event for the export: {text}"));
    assert_eq!(served["level"], "INFO");
    assert_eq!(served["fields"]["reason"], "Disconnect", "{served}");
    assert_eq!(served["fields"]["replies"], 1, "{served}");
    assert!(
        served["fields"]["bytes_out"].as_u64().unwrap_or(0) >= 4096,
        "{served}"
    );
    assert!(
        served["fields"]["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{served}"
    );
    // The second never chose an export.
    assert!(
        closed.iter().any(|e| e["fields"]["export"] == "-"),
        "{text}"
    );
}

#[test]
fn stats_has_totals_and_export_rows() {
    let server = Server::malloc();
    let text = stats_after_roundtrip(&server);
    assert!(
        text.contains("Total IOs: read 1 (0.0 MiB), write 1 (0.0 MiB)"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("default "))
        .unwrap_or_else(|| panic!("no export row: {text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "2", "IOs of export default: {row}");
    assert!(!text.contains("Gb/s"), "one unit for rates: {text}");
    let stats = server.rpc("get_stats");
    let recent = &stats["reactors"]
        .as_array()
        .expect("reactors")
        .iter()
        .flat_map(|r| r["exports"].as_array().cloned().unwrap_or_default())
        .find(|e| e["name"] == "default" && e["ios"] == 2)
        .expect("export row with the IOs")["recent"];
    assert_eq!(recent["count"], 2, "{recent}");
}

#[test]
fn stats_watch_repeats_until_interrupted() {
    let server = Server::malloc();
    let mut cmd = Command::new(BIN);
    cmd.args(["stats", "--watch", "0.2", "--rpc"])
        .arg(&server.rpc)
        .stdout(Stdio::piped());
    // A test run started in the background by a non-interactive shell
    // ignores SIGINT, and the child would inherit that and never stop: it
    // gets the default action, as an interactive user's `iopace stats` has.
    // SAFETY: signal() is async-signal-safe, as pre_exec requires.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd.spawn().expect("iopace stats --watch");
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child by its PID.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout);
    let reports = text.matches("iopace target:").count();
    assert!(reports >= 3, "{reports} reports in 1.5 s at 0.2 s: {text}");
}
