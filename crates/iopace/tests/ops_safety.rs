//! Safe defaults an operator relies on: nothing destroyed, absurd values
//! refused, a failed start cleans up, the admin socket is private and bounded,
//! set_pacing merges, SIGHUP reloads pacing.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const NULL_EXPORT: &str =
    "[[bdev]]\nname = \"n\"\nkind = \"null\"\nsize = \"1MiB\"\n[[export]]\nname = \"default\"\nbdev = \"n\"\n";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unix_and_rpc_paths_never_delete_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let important = dir.path().join("important.txt");
    std::fs::write(&important, "precious").expect("write");
    let imp = important.to_str().expect("utf-8");
    let port = free_port().to_string();
    let tcp = format!("127.0.0.1:{port}");
    let nbd_sock = dir.path().join("nbd.sock");
    for args in [
        vec!["--tcp", &tcp, "--unix", imp, "--rpc", "none"],
        vec![
            "--tcp",
            &tcp,
            "--unix",
            nbd_sock.to_str().expect("utf-8"),
            "--rpc",
            imp,
        ],
    ] {
        let out = serve_once(&args, NULL_EXPORT, dir.path());
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains("not a socket"), "{err}");
        assert!(
            !err.contains("iopace serving"),
            "serving logged too early: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&important).expect("kept"),
            "precious"
        );
        assert!(
            !nbd_sock.exists(),
            "a failed start left its NBD socket behind"
        );
    }
}

#[test]
fn check_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    let config = format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1.5GiB\"\n[[export]]\nname = \"default\"\nbdev = \"f\"\n",
        image.display()
    );
    let sock = dir.path().join("nbd.sock");
    let out = serve_once(
        &["--check", "--unix", sock.to_str().expect("utf-8")],
        &config,
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!image.exists(), "--check created the disk image");
    assert!(!sock.exists(), "--check created a socket");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON config");
    assert_eq!(json["bdev"][0]["size"], "1.5GiB");
}

#[test]
fn absurd_values_and_odd_files_exit_2_quickly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("s.sock").display().to_string();
    let huge_file = format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"8388608T\"\n\
         [[export]]\nname = \"default\"\nbdev = \"f\"\n",
        dir.path().join("huge.img").display()
    );
    for (config, args, needle) in [
        (
            format!("[server]\nmax_requests_per_reactor = 1000000000\n{NULL_EXPORT}"),
            vec!["--check"],
            "c.toml:2: field `server.max_requests_per_reactor`",
        ),
        (
            format!("[server]\nreactors = 100000\n{NULL_EXPORT}"),
            vec!["--check"],
            "c.toml:2: field `server.reactors`",
        ),
        (NULL_EXPORT.to_string(), vec!["--reactors", "100000"], "--reactors"),
        (
            format!("[server]\ntcp = [\n{{ addr = \"127.0.0.1:0\", gbps = 0 }}]\n{NULL_EXPORT}"),
            vec!["--check"],
            "c.toml:3: field `server.tcp.gbps`: 0: the wire's capacity in Gb/s",
        ),
        (
            format!("{NULL_EXPORT}[pacing]\nmode = \"rate\"\nperiod_us = 1e9\n"),
            vec!["--check"],
            "field `pacing.period_us`",
        ),
        (
            format!("{NULL_EXPORT}[cost.n]\nrbps = nan\nrseqiops = 1.0\nrrandiops = 1.0\nwbps = 1.0\nwseqiops = 1.0\nwrandiops = 1.0\n"),
            vec!["--check"],
            "c.toml:9: field `cost.n.rbps`",
        ),
        (
            format!("{NULL_EXPORT}[tls]\ncert = \"/nonexistent.pem\"\nkey = \"/nonexistent.key\"\n"),
            vec!["--check"],
            "c.toml:9: field `tls.cert`",
        ),
        (
            format!("[server]\ntls = \"require\"\n{NULL_EXPORT}"),
            vec!["--check"],
            "c.toml:2: field `server.tls`",
        ),
        // Socket paths no listener can take: too long for sun_path, or in a
        // directory that does not exist.
        (
            format!("[server]\nunix = [\"/tmp/{}.sock\"]\n{NULL_EXPORT}", "a".repeat(120)),
            vec!["--check"],
            "c.toml:2: field `server.unix`",
        ),
        (
            format!("[server]\nrpc = \"/nonexistent-dir/admin.sock\"\n{NULL_EXPORT}"),
            vec!["--check"],
            "c.toml:2: field `server.rpc`",
        ),
        (
            NULL_EXPORT.to_string(),
            vec!["--check", "--unix", "/nonexistent-dir/nbd.sock"],
            "--unix",
        ),
        // Sizes no NBD client takes, RAM disks no address space holds (in
        // --check as when serving), RAM no machine here has, and fields
        // the bdev's kind does not use.
        (
            NULL_EXPORT.replace("1MiB", "8388608T"),
            vec!["--check"],
            "c.toml:4: field `bdev.size`",
        ),
        (
            huge_file.clone(),
            vec!["--check"],
            "c.toml:5: field `bdev.size`",
        ),
        (
            huge_file,
            vec!["--tcp", "none", "--unix", &sock, "--rpc", "none"],
            "c.toml:5: field `bdev.size`",
        ),
        (
            NULL_EXPORT.replace("null", "malloc").replace("1MiB", "4194304T"),
            vec!["--check"],
            "c.toml:4: field `bdev.size`: cannot map 4194304TiB of address space",
        ),
        (
            NULL_EXPORT.replace("null", "malloc").replace("1MiB", "4194304T"),
            vec!["--tcp", "none", "--unix", &sock, "--rpc", "none"],
            "c.toml:4: field `bdev.size`: cannot map",
        ),
        (
            NULL_EXPORT
                .replace("null", "malloc")
                .replace("size = \"1MiB\"", "size = \"1MiB\"\nmax_resident = \"1000000T\""),
            vec!["--check"],
            "c.toml:5: field `bdev.max_resident`",
        ),
        (
            NULL_EXPORT.replace("size = \"1MiB\"", "size = \"1MiB\"\nmax_resident = \"1M\""),
            vec!["--check"],
            "c.toml:5: field `bdev.max_resident`: a null bdev has no `max_resident`",
        ),
    ] {
        let out = serve_once(&args, &config, dir.path());
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{needle}: {}", stderr(&out));
    }
    assert!(
        !dir.path().join("huge.img").exists(),
        "a failed start created it"
    );
    let start = Instant::now();
    let out = Command::new(BIN)
        .args(["serve", "--config", "/dev/urandom"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_size_smaller_than_the_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).expect("write");
    let config = format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"10KB\"\n[[export]]\nname = \"default\"\nbdev = \"f\"\n",
        image.display()
    );
    let out = serve_once(&["--check"], &config, dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("c.toml:5: field `bdev.size`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::metadata(&image).expect("kept").len(), 1 << 20);
}

/// One JSON-RPC call with params; returns the whole reply.
fn call(sock: &Path, method: &str, params: serde_json::Value) -> serde_json::Value {
    let mut s = UnixStream::connect(sock).expect("connect admin socket");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").expect("write");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read");
    serde_json::from_str(&line).expect("JSON reply")
}

#[test]
fn set_pacing_merges_and_validates() {
    let server = Server::start(&format!(
        "{MALLOC_EXPORTS}\n[pacing]\nmode = \"auto\"\ngain = 3.0\nmax_window = 8388608\n"
    ));
    let out = Command::new(BIN)
        .args([
            "rpc",
            "set_pacing",
            r#"{"mode":"rate","period_us":500}"#,
            "--rpc",
        ])
        .arg(&server.rpc)
        .output()
        .expect("iopace rpc");
    assert!(out.status.success(), "{}", stderr(&out));
    let pacing = &server.rpc("get_config")["pacing"];
    assert_eq!(pacing["mode"], "rate", "{pacing}");
    assert_eq!(pacing["gain"], 3.0, "gain kept: {pacing}");
    assert_eq!(pacing["max_window"], 8388608, "max_window kept: {pacing}");
    let r = call(
        &server.rpc,
        "set_pacing",
        serde_json::json!({"period_us": 1e9}),
    );
    assert!(r["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("period_us")));
    assert_eq!(server.rpc("get_config")["pacing"]["period_us"], 500.0);
    roundtrip_ok(&server);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn sighup_reloads_pacing_and_keeps_serving() {
    let server = Server::start(MALLOC_EXPORTS);
    let cfg = server.dir.path().join("iopace.toml");
    let text = std::fs::read_to_string(&cfg).expect("config");
    // Pacing changes live; a new export and a new reactor count need a restart.
    let text = text.replace("reactors = 2", "reactors = 3");
    let extra = "[[export]]\nname = \"extra\"\nbdev = \"m0\"\n";
    std::fs::write(&cfg, format!("{text}\n{extra}\n[pacing]\ngain = 5.0\n")).expect("rewrite");
    // SAFETY: signalling our own child by its PID.
    unsafe {
        libc::kill(server.pid() as i32, libc::SIGHUP);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.rpc("get_config")["pacing"]["gain"] != 5.0 {
        assert!(Instant::now() < deadline, "{}", server.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    roundtrip_ok(&server);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("SIGHUP: pacing reloaded"), "{log}");
    assert!(
        log.contains("SIGHUP: export `extra` added: needs a restart, not applied"),
        "{log}"
    );
    assert!(
        log.contains("SIGHUP: server: reactors: needs a restart"),
        "{log}"
    );
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("Threads line")
}

#[test]
fn admin_socket_is_private_and_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let rpc = dir.path().join("admin.sock");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nreactors = 1\ntcp = [\"localhost:{port}\"]\nunix = []\nrpc = \"{}\"\n{NULL_EXPORT}",
            rpc.display()
        ),
    )
    .expect("write");
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .stderr(Stdio::null());
    // SAFETY: umask in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&rpc).is_err() {
        assert!(Instant::now() < deadline, "admin socket never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&rpc).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "admin socket mode {mode:o}");
    let idle: Vec<UnixStream> = (0..300)
        .filter_map(|_| UnixStream::connect(&rpc).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let threads = threads_of(child.id());
    assert!(
        threads < 40,
        "{threads} threads for {} idle clients",
        idle.len()
    );
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    let r = call(&rpc, "get_stats", serde_json::Value::Null);
    assert!(r.get("result").is_some(), "{r}");
    // The host name resolved: TCP serves too.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn stats_on_a_wrong_socket_says_so() {
    let server = Server::malloc();
    let out = Command::new(BIN)
        .args(["stats", "--rpc"])
        .arg(&server.sock)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not an iopace admin socket"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn export_descriptions_are_in_the_list() {
    require("nbdinfo", "libnbd-bin");
    let body = MALLOC_EXPORTS.replace(
        "name = \"default\"\nbdev = \"m0\"",
        "name = \"default\"\nbdev = \"m0\"\ndescription = \"scratch disk for tests\"",
    );
    let server = Server::start(&body);
    let out = Command::new("timeout")
        .args(["20", "nbdinfo", "--list", &server.tcp_uri("")])
        .output()
        .expect("nbdinfo --list");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("description: scratch disk for tests"),
        "{text}"
    );
}

#[test]
fn running_out_of_descriptors_logs_at_a_bounded_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[server]\nreactors = 1\ntcp = [\"127.0.0.1:{port}\"]\nunix = []\nrpc = \"\"\n{NULL_EXPORT}"),
    )
    .expect("write");
    let log = dir.path().join("log");
    // Few descriptors: the server starts, and its accepts soon fail with EMFILE.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 40 && exec {BIN} serve --config {}",
            cfg.display()
        ))
        .stderr(std::fs::File::create(&log).expect("log"))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = Vec::new();
    while held.is_empty() {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => held.push(s),
            Err(_) => {
                assert!(Instant::now() < deadline, "not serving");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    for _ in 0..60 {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            held.push(s);
        }
    }
    // About 40 retries a second while the backlog waits.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child by its PID.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    drop(held);
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).expect("log");
    let warnings = text.lines().filter(|l| l.contains("accept: ")).count();
    assert!(text.contains("Too many open files"), "{text}");
    assert!(
        warnings <= 2,
        "{warnings} accept warnings in 1.5 s:\n{text}"
    );
}

#[test]
fn admin_socket_refuses_other_users_by_peer_credentials() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to connect as another user");
        return;
    }
    require("python3", "python3");
    let server = Server::malloc();
    // Open the path to everyone, so only SO_PEERCRED stands in the way.
    for p in [server.dir.path(), server.rpc.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    // Refused: the server closes without a word (a reset or a broken pipe).
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ntry:\n  s.sendall(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"get_config\"}\\n')\n  sys.stdout.write(s.recv(65536).decode())\nexcept OSError:\n  pass\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&server.rpc)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("python3 as nobody");
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!reply.contains("result"), "nobody got an answer: {reply}");
    // Our own user still gets one.
    assert!(server.rpc("get_config")["server"].is_object());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("admin socket: refused a client of another user"),
        "{log}"
    );
}

/// Two servers (or two bdevs) on one image would each overwrite what the
/// other acknowledged: the second is refused while the first holds it.
#[test]
fn an_image_served_by_another_process_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    let body = format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\n[[export]]\nname = \"default\"\nbdev = \"f\"\n",
        image.display()
    );
    let first = Server::start(&body);
    let out = serve_once(
        &["--tcp", "127.0.0.1:0", "--unix", "none", "--rpc", "none"],
        &body,
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("c.toml:4: field `bdev.path`"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("in use"), "{}", stderr(&out));
    let twice = format!(
        "{body}[[bdev]]\nname = \"g\"\nkind = \"file\"\npath = \"{}\"\n",
        image.display()
    );
    drop(first);
    let out = serve_once(
        &["--tcp", "127.0.0.1:0", "--unix", "none", "--rpc", "none"],
        &twice,
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("in use"), "{}", stderr(&out));
}

/// A file image larger than its filesystem's free space is a thin image,
/// served as qemu-nbd and nbdkit serve one; `serve --check` and `serve`
/// say so up front (file, line, field) instead of leaving the user to
/// find out from ENOSPC on a write.
#[test]
fn a_file_larger_than_the_free_space_is_served_thin_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("thin.img");
    let size = free_bytes(dir.path().to_str().expect("utf-8")) + (4 << 30);
    let body = format!(
        "[[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = {size}\n[[export]]\nname = \"default\"\nbdev = \"f\"\n",
        image.display()
    );
    let out = serve_once(&["--check"], &body, dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("c.toml:5: field `bdev.size`")
            && stderr(&out).contains("served thin"),
        "{}",
        stderr(&out)
    );
    assert!(!image.exists(), "--check created the image");
    let server = Server::start(&body);
    assert!(
        server.log_text().contains("served thin"),
        "{}",
        server.log_text()
    );
    assert_eq!(std::fs::metadata(&image).expect("created").len(), size);
    roundtrip_ok(&server);
    // Within the free space: no warning.
    drop(server);
    std::fs::remove_file(&image).expect("remove");
    let body = body.replace(&format!("size = {size}"), "size = \"1MiB\"");
    let out = serve_once(&["--check"], &body, dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("thin"), "{}", stderr(&out));
}
