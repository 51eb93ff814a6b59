//! Start-up errors and shutdown.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn serve_config(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).expect("write");
    let out = Command::new(BIN)
        .args(["serve", "--check", "--config"])
        .arg(&path)
        .output()
        .expect("run iopace");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).replace(&*path.to_string_lossy(), "FILE"),
    )
}

#[test]
fn config_errors_name_file_line_field_and_exit_2() {
    let (code, err) = serve_config("[server]\nreactors = 1\n[buffers]\nnum_shared_bufers = 3\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("FILE:4"), "{err}");
    assert!(err.contains("num_shared_bufers"), "{err}");

    let body = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1MiB\"\n\n[[bdev]]\nname = \"d\"\nkind = \"delay\"\nbase = \"nope\"\n\n[[export]]\nname = \"e\"\nbdev = \"d\"\n";
    let (code, err) = serve_config(body);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("FILE:9: field `bdev.base`"), "{err}");

    let (code, err) = serve_config("[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1MiB\"\n[[export]]\nname = \"e\"\nbdev = \"zz\"\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("FILE:7: field `export.bdev`"), "{err}");

    let (code, err) = serve_config("[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"lots\"\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("FILE:4") && err.contains("size"), "{err}");
}

#[test]
fn missing_config_file_exits_2() {
    let out = Command::new(BIN)
        .args(["serve", "--config", "/nonexistent/iopace.toml"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn sigterm_with_io_in_flight_drains_and_exits_0() {
    require("fio", "fio");
    let body = format!(
        "{MALLOC_EXPORTS}\n[[bdev]]\nname = \"slow\"\nkind = \"delay\"\nbase = \"m0\"\nread_avg_us = 2000\nwrite_avg_us = 2000\n[[export]]\nname = \"slow\"\nbdev = \"slow\"\n"
    );
    let server = Server::start(&body);
    let fio = Reaped(
        Command::new("fio")
            .args([
                "--name=bg",
                // Jobs as threads, so `Reaped`'s SIGKILL ends them too.
                "--thread",
                "--ioengine=nbd",
                &format!("--uri={}", server.unix_uri("slow")),
                "--rw=randrw",
                "--bs=64k",
                "--iodepth=32",
                "--time_based",
                "--runtime=30",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("fio"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let stats = server.rpc("get_stats");
    let in_flight: u64 = stats["reactors"]
        .as_array()
        .expect("reactors")
        .iter()
        .map(|r| r["requests_in_flight"].as_u64().unwrap_or(0))
        .sum();
    assert!(in_flight > 0, "expected IO in flight: {stats:#}");
    let (status, text) = server.stop();
    drop(fio);
    assert!(status.success(), "exit {status}:\n{text}");
    // 256 large buffers and the small ones, all back.
    let (free, total) = pool_at_exit(&text);
    assert!(
        free.is_some() && free == total && total >= Some(256),
        "every buffer back at exit:\n{text}"
    );
}

#[test]
fn stats_command_prints_reactor_report() {
    let server = Server::malloc();
    let text = stats_after_roundtrip(&server);
    assert!(
        text.contains("Reactor 0") && text.contains("Bufs in-flight"),
        "{text}"
    );
    assert!(
        text.contains("Pacer auto"),
        "pacer line in the report: {text}"
    );
    let stats = server.rpc("get_stats");
    assert_eq!(stats["reactors"][0]["pacer"]["mode"], "auto", "{stats:#}");
    let cfg = server.rpc("get_config");
    assert_eq!(cfg["buffers"]["num_shared_buffers"], 256, "{cfg:#}");
}
