//! The fault bdev (`kind = "fault"`) on the real target, with real clients:
//! qemu-io and fio see each injected error with its errno in NBD error
//! replies (whole requests, and WRITEs in pieces past the buffer size),
//! latency and spikes, stalls held or timed, fail after N and a failing
//! range, set in the TOML or at run time with `iopace rpc set_fault`;
//! another export beside it is untouched, and every buffer is back at exit.
//! `iopace rpc trace` shows a stalled read's states and times.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// A 64 MiB RAM export `flaky` behind a fault bdev with `fault` keys, and
/// a clean one beside it; 128 KiB buffers, so 512 KiB is four of them.
fn body(fault: &str) -> String {
    format!(
        "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"64MiB\"\n\n\
         [[bdev]]\nname = \"m1\"\nkind = \"malloc\"\nsize = \"64MiB\"\n\n\
         [[bdev]]\nname = \"flaky\"\nkind = \"fault\"\nbase = \"m0\"\n{fault}\n\n\
         [[export]]\nname = \"flaky\"\nbdev = \"flaky\"\n\n\
         [[export]]\nname = \"clean\"\nbdev = \"m1\"\n"
    )
}

const BUFFERS: &str = "buffer_size = \"128KiB\"\nnum_shared_buffers = 64\nbuf_cache_size = 4";

fn start(fault: &str) -> Server {
    Server::start_with(&body(fault), BUFFERS)
}

/// `iopace rpc set_fault PARAMS`, as a user types it.
fn set_fault(server: &Server, params: &str) -> serde_json::Value {
    rpc_cli(server, "set_fault", params)
}

/// `iopace rpc METHOD PARAMS`: its JSON answer.
fn rpc_cli(server: &Server, method: &str, params: &str) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["rpc", method, params, "--rpc"])
        .arg(&server.rpc)
        .output()
        .expect("iopace rpc");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{method} {params}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).expect("the RPC answers JSON")
}

/// qemu-io's commands on `export`, failing or not: (success, output).
fn qemu_io_any(server: &Server, export: &str, cmds: &[&str]) -> (bool, String) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = bounded(c.arg(server.unix_uri(export)));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Runs `cmd` to its end within [`LIMIT`], success or not.
fn bounded(cmd: &mut Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    wait_bounded(child, LIMIT)
}

fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("client did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

/// fio with the nbd engine on `export` and `args`; its job's JSON.
fn fio(server: &Server, export: &str, args: &[&str]) -> serde_json::Value {
    let out = bounded(
        Command::new("fio")
            .args(["--name=j", "--ioengine=nbd", "--output-format=json"])
            .arg(format!("--uri={}", server.unix_uri(export)))
            .args(args),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // The nbd engine says "connected" on stdout before the JSON.
    let json = text.find('{').map_or("", |at| &text[at..]);
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| {
        panic!(
            "fio JSON: {e}\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["jobs"][0].clone()
}

/// Every buffer back in the pool, then stopped: the log says so too.
fn stop_with_pool_full(server: Server, buffers: u64) {
    server.assert_quiescent(buffers);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    let (free, total) = pool_at_exit(&log);
    assert!(
        free.is_some() && free == total,
        "every buffer back at exit:\n{log}"
    );
}

#[test]
fn qemu_io_sees_each_errno_on_the_chosen_ops_and_range() {
    require("qemu-io", "qemu-utils");
    let server = start(
        "ops = [\"read\"]\nerrno = \"ENOSPC\"\n\
         fail_range = { offset = 1048576, length = 1048576 }",
    );
    let (ok, out) = qemu_io_any(
        &server,
        "flaky",
        &[
            "read 0 4k",
            "read 1M 4k",
            "write 1M 4k",
            "read 2047k 1k",
            "read 2M 4k",
            // Four 128 KiB buffers, the last one touching the range.
            "read 640k 512k",
            // Streamed in 32 pieces (more than four buffers), the fourth
            // failing after the first three were sent: the reply ends
            // with its error chunk and the connection goes on.
            "read 640k 4M",
            "read 5M 4M",
        ],
    );
    assert!(!ok, "{out}");
    let failed: Vec<&str> = out.lines().filter(|l| l.contains("failed")).collect();
    assert_eq!(failed, ["read failed: No space left on device"; 4], "{out}");
    assert!(
        out.contains("read 4194304/4194304 bytes at offset 5242880"),
        "{out}"
    );
    assert!(
        out.contains("wrote 4096/4096 bytes at offset 1048576"),
        "{out}"
    );
    assert!(
        out.contains("read 4096/4096 bytes at offset 2097152"),
        "{out}"
    );
    for (errno, text) in [
        ("EPERM", "Operation not permitted"),
        ("EIO", "Input/output error"),
        ("ENOMEM", "Cannot allocate memory"),
        ("EINVAL", "Invalid argument"),
        ("EOVERFLOW", "Value too large for defined data type"),
        ("ENOTSUP", "Operation not supported"),
        ("ESHUTDOWN", "Cannot send after transport endpoint shutdown"),
    ] {
        let r = set_fault(&server, &format!(r#"{{"bdev":"flaky","errno":"{errno}"}}"#));
        assert_eq!(r["params"]["errno"], errno, "{r}");
        let (ok, out) = qemu_io_any(&server, "flaky", &["read 1M 4k", "read 0 4k"]);
        assert!(
            !ok && out.contains(&format!("read failed: {text}")),
            "{errno}: {out}"
        );
        assert!(
            out.contains("read 4096/4096 bytes at offset 0"),
            "{errno}: {out}"
        );
    }
    stop_with_pool_full(server, 64);
}

#[test]
fn writes_zeroes_trims_flushes_and_caches_fail_as_chosen_and_the_clean_export_does_not() {
    require("qemu-io", "qemu-utils");
    require("fio", "fio");
    let server = start("ops = [\"write\", \"zeroes\", \"trim\", \"flush\", \"cache\"]\nerrno = \"EPERM\"\nerror_rate = 1.0");
    // Meanwhile, fio writes and verifies the export beside it.
    let clean = Command::new("fio")
        .args([
            "--name=clean",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=16M",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .arg(format!("--uri={}", server.unix_uri("clean")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio");
    let (ok, out) = qemu_io_any(
        &server,
        "flaky",
        &[
            "write 0 4k",
            "write -z 0 4k",
            "discard 0 4k",
            // Sixteen 128 KiB pieces, each its own device write.
            "write 4M 2M",
            "read 0 4k",
        ],
    );
    assert!(!ok, "{out}");
    for op in ["write", "write", "discard", "write"] {
        assert!(
            out.contains(&format!("{op} failed: Operation not permitted")),
            "{out}"
        );
    }
    assert_eq!(out.matches("failed").count(), 4, "{out}");
    assert!(out.contains("read 4096/4096 bytes at offset 0"), "{out}");
    // FLUSH and CACHE: qemu-io says only its exit status, so ask directly.
    let mut c = raw_unix(&server, "flaky");
    for (cmd, cookie) in [(3u16, 1u64), (5, 2)] {
        c.request(cmd, 0, cookie, 0, if cmd == 5 { 4096 } else { 0 });
        assert_eq!(c.simple_reply(), (1, cookie), "command {cmd}: EPERM");
    }
    drop(c);
    let out = wait_bounded(clean, LIMIT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).expect("fio JSON");
    assert_eq!(v["jobs"][0]["error"], 0, "{text}");
    stop_with_pool_full(server, 64);
}

#[test]
fn fio_sees_the_error_rate_and_fail_after() {
    require("fio", "fio");
    let server = start("ops = [\"read\"]\nerror_rate = 0.1");
    let job = fio(
        &server,
        "flaky",
        &[
            "--rw=randread",
            "--bs=4k",
            "--iodepth=16",
            "--size=32M",
            "--number_ios=4000",
            "--continue_on_error=all",
        ],
    );
    let (errors, ios) = (job["total_err"].as_u64(), job["read"]["total_ios"].as_u64());
    let (errors, ios) = (errors.unwrap_or(0), ios.unwrap_or(0));
    assert_eq!(job["first_error"], 5, "EIO: {job}");
    assert!(
        ios >= 4000 && (280..=520).contains(&errors),
        "{errors} of {ios}"
    );
    let faults = server.rpc("get_faults");
    assert_eq!(faults[0]["errors"], errors, "{faults}");
    // After 100 IOs from now, every one fails.
    let r = set_fault(
        &server,
        r#"{"bdev":"flaky","error_rate":0,"fail_after":100}"#,
    );
    assert_eq!(r["ios"], 0, "{r}");
    let job = fio(
        &server,
        "flaky",
        &[
            "--rw=read",
            "--bs=4k",
            "--iodepth=1",
            "--size=1200k",
            "--continue_on_error=all",
        ],
    );
    assert_eq!(job["total_err"], 200, "{job}");
    // The clean export never saw one.
    let job = fio(&server, "clean", &["--rw=randread", "--bs=4k", "--size=8M"]);
    assert_eq!(job["error"], 0, "{job}");
    stop_with_pool_full(server, 64);
}

#[test]
fn fio_sees_the_errno_of_a_piece_failing_mid_stream() {
    require("fio", "fio");
    // 1 MiB READs stream in pieces of 128 KiB: the one touching the range
    // fails mid-stream with its errno, the three others are whole.
    let server = start(
        "ops = [\"read\"]\nerrno = \"ENOSPC\"\n\
         fail_range = { offset = 1572864, length = 1 }",
    );
    let job = fio(
        &server,
        "flaky",
        &[
            "--rw=read",
            "--bs=1M",
            "--size=4M",
            "--continue_on_error=all",
            "--ignore_error=ENOSPC",
        ],
    );
    assert_eq!(
        (&job["total_err"], &job["first_error"]),
        (&1.into(), &28.into()),
        "{job}"
    );
    assert_eq!(job["read"]["io_bytes"], 3 << 20, "{job}");
    stop_with_pool_full(server, 64);
}

/// Mean and 99th percentile completion latency of a fio job's reads, in us.
fn read_latency_us(job: &serde_json::Value) -> (f64, f64) {
    let clat = &job["read"]["clat_ns"];
    let mean = clat["mean"].as_f64().unwrap_or(0.0) / 1000.0;
    let p99 = clat["percentile"]["99.000000"].as_f64().unwrap_or(0.0) / 1000.0;
    (mean, p99)
}

#[test]
fn latency_and_spikes_are_timers_at_any_queue_depth() {
    require("fio", "fio");
    // Unpaced (`auto` would window the device by its latency), and a pool
    // of which a quarter (what one connection may commit) takes QD 32.
    let server = Server::start_with(
        &format!("{}\n[pacing]\nmode = \"none\"\n", body("latency_us = 5000")),
        "buffer_size = \"128KiB\"\nnum_shared_buffers = 256\nbuf_cache_size = 4",
    );
    let job = fio(
        &server,
        "flaky",
        &[
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--size=32M",
            "--time_based",
            "--runtime=3",
        ],
    );
    let (mean, _) = read_latency_us(&job);
    let iops = job["read"]["iops"].as_f64().unwrap_or(0.0);
    // 32 at once for 5 ms each is 6,400 IOPS; a thread sleeping per IO
    // (or one at a time) would give 200. A release build gets 5,800; a
    // debug build got 2,800 with a soak running beside it.
    assert!(
        mean >= 5000.0 && iops > 1000.0,
        "mean {mean} us, {iops} IOPS"
    );
    set_fault(
        &server,
        r#"{"bdev":"flaky","latency_us":0,"spike_us":50000,"spike_rate":0.05}"#,
    );
    let job = fio(
        &server,
        "flaky",
        &[
            "--rw=randread",
            "--bs=4k",
            "--iodepth=1",
            "--size=32M",
            "--number_ios=400",
        ],
    );
    let (mean, p99) = read_latency_us(&job);
    let p50 = job["read"]["clat_ns"]["percentile"]["50.000000"]
        .as_f64()
        .unwrap_or(0.0)
        / 1000.0;
    // 5% of IOs take 50 ms more: the mean is near 2.5 ms, the median not.
    assert!(p50 < 10_000.0 && p99 >= 50_000.0, "p50 {p50} p99 {p99} us");
    assert!((1_000.0..6_000.0).contains(&mean), "mean {mean} us");
    let job = fio(&server, "clean", &["--rw=randread", "--bs=4k", "--size=8M"]);
    let (mean, _) = read_latency_us(&job);
    assert!(mean < 5000.0, "the clean export is not slowed: {mean} us");
    stop_with_pool_full(server, 256);
}

/// qemu-io reading 4 KiB of `flaky` in the background.
fn background_read(server: &Server) -> Child {
    Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 0 4k"])
        .arg(server.unix_uri("flaky"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io")
}

fn in_flight(server: &Server) -> u64 {
    let stats = server.rpc("get_stats");
    let reactors = stats["reactors"].as_array().cloned().unwrap_or_default();
    reactors
        .iter()
        .map(|r| r["requests_in_flight"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn stalls_hold_io_until_released_or_for_their_time() {
    require("qemu-io", "qemu-utils");
    let server = start("stall = true");
    let mut held = background_read(&server);
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        held.try_wait().expect("wait").is_none(),
        "a held read finished"
    );
    assert!(in_flight(&server) >= 1);
    assert_eq!(server.rpc("get_faults")[0]["stall"], "held");
    // `iopace rpc trace` shows where the held read is and how it got there.
    let traced = rpc_cli(&server, "trace", r#"{"oldest": 4}"#);
    let reqs = traced["requests"].as_array().cloned().unwrap_or_default();
    let read = reqs
        .iter()
        .find(|r| r["command"] == "Read")
        .unwrap_or_else(|| panic!("no READ in flight: {traced:#}"));
    assert_eq!(read["state"], "Delayed", "{read:#}");
    let states: Vec<&str> = (read["states"].as_array().into_iter().flatten())
        .filter_map(|s| s["state"].as_str())
        .collect();
    assert!(
        states.starts_with(&["New"]) && states.ends_with(&["Device", "Executed", "Delayed"]),
        "{read:#}"
    );
    assert!(read["age_us"].as_f64() > Some(500_000.0), "{read:#}");
    let one = format!(
        r#"{{"conn": {}, "reactor": {}}}"#,
        read["conn"], read["reactor"]
    );
    let same = rpc_cli(&server, "trace", &one);
    assert_eq!(same["requests"][0]["cookie"], read["cookie"], "{same:#}");
    // The clean export is served meanwhile.
    let (ok, out) = qemu_io_any(&server, "clean", &["write 0 4k", "read 0 4k"]);
    assert!(ok, "{out}");
    let released = Instant::now();
    set_fault(&server, r#"{"bdev":"flaky","stall":false}"#);
    let out = wait_bounded(held, Duration::from_secs(10));
    assert!(out.status.success(), "{out:?}");
    assert!(released.elapsed() < Duration::from_secs(2));
    // A timed stall: 1.5 s from when it is set.
    let r = set_fault(&server, r#"{"bdev":"flaky","stall_ms":1500}"#);
    assert_ne!(r["stall"], "no", "{r}");
    let t = Instant::now();
    let out = wait_bounded(background_read(&server), Duration::from_secs(10));
    let took = t.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert!(
        (Duration::from_millis(1300)..Duration::from_secs(5)).contains(&took),
        "{took:?}"
    );
    let held = server.rpc("get_faults")[0]["held"].as_u64();
    assert!(held >= Some(2), "{held:?}");
    stop_with_pool_full(server, 64);
}

#[test]
fn bad_fault_keys_name_file_line_and_field_and_exit_2() {
    // The fault keys' line in `body`.
    const LINE: u32 = 15;
    let dir = tempfile::tempdir().expect("tempdir");
    for (fault, field, line) in [
        ("error_rate = 1.5", "bdev.error_rate", LINE),
        ("errno = \"EWHAT\"", "errno", LINE),
        ("ops = [\"read\", \"sing\"]", "ops", LINE),
        ("latency_us = -1", "bdev.latency_us", LINE),
        ("stall_ms = 99999999", "bdev.stall_ms", LINE),
        (
            "fail_range = { offset = \"64MiB\", length = 1 }",
            "bdev.fail_range",
            LINE,
        ),
        ("fail_range = { offset = 0 }", "length", LINE),
    ] {
        let out = serve_once(&["--check"], &body(fault), dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{fault}: {err}");
        assert!(err.contains(&format!("c.toml:{line}")), "{fault}: {err}");
        assert!(err.contains(field), "{fault}: {err}");
    }
}
