//! READ replies whose data a RAM export lends go out through a pipe
//! (`[server] splice`): vmsplice of the export's pages, splice into the
//! socket. Real clients read back what they wrote; reads in flight while
//! the same range is rewritten, zeroed and trimmed return only bytes the
//! range held at some point, with intact framing; a client that hangs up
//! mid-stream leaves the server serving, its pipe closed and every buffer
//! back in the pool.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{qemu_io, raw_tcp, raw_unix, require, Server};

const READ: u16 = 0;
const WRITE: u16 = 1;
const TRIM: u16 = 4;
const WRITE_ZEROES: u16 = 6;

const BODY: &str = r#"
[[bdev]]
name = "m0"
kind = "malloc"
size = "64MiB"

[[export]]
name = "default"
bdev = "m0"
"#;

/// Splicing on every transport, with a small Unix send buffer so deep
/// reads fill the socket and the reactor waits for room.
fn splicing_server() -> Server {
    Server::start_full(
        "splice = \"all\"\nunix_send_buffer = \"256KiB\"",
        BODY,
        "num_shared_buffers = 256\nbuf_cache_size = 8",
    )
}

/// Pipes the server process holds open.
fn pipes(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .expect("fd dir")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("pipe:"))
        .count()
}

/// Waits (up to 10 s, for a loaded machine) until the server's pipe
/// count satisfies `ok`.
fn wait_pipes(server: &Server, what: &str, ok: impl Fn(usize) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = pipes(server);
        if ok(n) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {n} pipes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn real_clients_read_back_what_they_wrote_on_both_transports() {
    require("qemu-io", "qemu-utils");
    let server = splicing_server();
    let limit = Duration::from_secs(60);
    let unix = server.unix_uri("default");
    let tcp = server.tcp_uri("default");
    // Eight MiB, one pattern per MiB; then reads of many sizes and
    // alignments, some in flight together (aio), over both transports.
    let mut writes: Vec<String> = (0..8)
        .map(|i| format!("write -P {} {}M 1M", 0x41 + i, i))
        .collect();
    writes.push("aio_flush".into());
    let w: Vec<&str> = writes.iter().map(String::as_str).collect();
    qemu_io(&unix, &w, limit);
    let mut reads = Vec::new();
    for i in 0..8 {
        let p = 0x41 + i;
        reads.push(format!("read -P {p} {i}M 1M"));
        reads.push(format!("read -P {p} {}k 128k", i * 1024 + 4));
        reads.push(format!("aio_read -P {p} {}k 256k", i * 1024 + 512));
        reads.push(format!("aio_read -P {p} {}k 64k", i * 1024 + 64));
        reads.push(format!("read -P {p} {}k 4k", i * 1024 + 1020));
    }
    reads.push("aio_flush".into());
    let r: Vec<&str> = reads.iter().map(String::as_str).collect();
    for uri in [&unix, &tcp] {
        let out = qemu_io(uri, &r, limit);
        assert!(!out.contains("Pattern verification failed"), "{uri}: {out}");
        assert!(!out.contains("failed"), "{uri}: {out}");
    }
    // A read spanning two patterns, whole.
    let out = qemu_io(&unix, &["read -P 0x42 1M 1M", "read -v 2047k 2k"], limit);
    assert!(
        out.contains("42 42 42 42") && out.contains("43 43 43 43"),
        "{out}"
    );
    server.assert_quiescent(256);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

/// The client's `n` queued READ replies of `len` bytes with cookies from
/// `first`: each must carry bytes the range held at some point.
fn check_replies<S: std::io::Read + Write>(
    c: &mut common::RawClient<S>,
    first: u64,
    n: u64,
    len: usize,
    allowed: &[u8],
) {
    for k in 0..n {
        assert_eq!(c.simple_reply(), (0, first + k), "reply {k}: framing");
        let data = c.read_exact(len);
        if let Some(at) = data.iter().position(|b| !allowed.contains(b)) {
            panic!(
                "reply {k}: byte {at} is {:#x}, not one of {allowed:x?}",
                data[at]
            );
        }
    }
}

#[test]
fn rewrites_zeroing_and_trims_while_reads_are_in_flight_show_only_held_bytes() {
    let server = splicing_server();
    let baseline = pipes(&server);
    let mib = 1u64 << 20;
    let len = 128u32 << 10;
    let mut writer = raw_unix(&server, "default");
    let write = |c: &mut common::RawClient<std::os::unix::net::UnixStream>, cookie, off, byte| {
        c.request(WRITE, 0, cookie, off, 4 << 20);
        c.s.write_all(&vec![byte; 4 << 20]).expect("payload");
        assert_eq!(c.simple_reply(), (0, cookie));
    };
    // Range A (0..4 MiB) holds 0x11, range B (8..12 MiB) holds 0x22.
    write(&mut writer, 1, 0, 0x11);
    write(&mut writer, 2, 8 * mib, 0x22);

    // 64 READs of 128 KiB from each range (16 MiB of replies: far more than
    // the socket holds) queue up unread on one connection.
    let mut reader = raw_unix(&server, "default");
    for k in 0..64u64 {
        reader.request(READ, 0, 100 + k, (k % 32) * u64::from(len), len);
    }
    for k in 0..64u64 {
        reader.request(READ, 0, 200 + k, 8 * mib + (k % 32) * u64::from(len), len);
    }
    wait_pipes(&server, "the reader's replies go through a pipe", |n| {
        n > baseline
    });

    // Meanwhile A is rewritten, zeroed (whole pages go back to the kernel),
    // trimmed and written again, each acknowledged before the next.
    write(&mut writer, 3, 0, 0x33);
    writer.request(WRITE_ZEROES, 0, 4, 0, 4 << 20);
    assert_eq!(writer.simple_reply(), (0, 4));
    writer.request(TRIM, 0, 5, 0, 4 << 20);
    assert_eq!(writer.simple_reply(), (0, 5));
    write(&mut writer, 6, 0, 0x44);

    // A's replies were in flight across all of it: each byte is one A held.
    check_replies(
        &mut reader,
        100,
        64,
        len as usize,
        &[0x11, 0x33, 0x00, 0x44],
    );
    // B was never touched: its replies are exactly its data.
    check_replies(&mut reader, 200, 64, len as usize, &[0x22]);
    // Reads after the last acknowledged write see it, whole.
    for k in 0..32u64 {
        reader.request(READ, 0, 300 + k, k * u64::from(len), len);
    }
    check_replies(&mut reader, 300, 32, len as usize, &[0x44]);

    // Over TCP (splice = "all") too.
    let mut tcp = raw_tcp(&server, "default");
    for k in 0..32u64 {
        tcp.request(READ, 0, 400 + k, 8 * mib + k * u64::from(len), len);
    }
    check_replies(&mut tcp, 400, 32, len as usize, &[0x22]);

    drop((reader, writer, tcp));
    server.assert_quiescent(256);
    wait_pipes(&server, "closed connections close their pipes", |n| {
        n == baseline
    });
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_client_hanging_up_mid_stream_leaves_the_server_whole() {
    let server = splicing_server();
    let baseline = pipes(&server);
    let len = 128u32 << 10;
    let mut w = raw_unix(&server, "default");
    w.request(WRITE, 0, 1, 0, 4 << 20);
    w.s.write_all(&vec![0x5a; 4 << 20]).expect("payload");
    assert_eq!(w.simple_reply(), (0, 1));
    for round in 0..4u64 {
        let mut c = raw_unix(&server, "default");
        for k in 0..96u64 {
            c.request(READ, 0, k, (k % 32) * u64::from(len), len);
        }
        // Read a few replies (the last round none), then hang up with the
        // rest in the socket, the pipe and the queue.
        check_replies(&mut c, 0, round, len as usize, &[0x5a]);
        if round == 2 {
            // Half a reply read.
            let _ = c.read_exact(16 + 1000);
        }
        drop(c);
    }
    server.assert_quiescent(256);
    wait_pipes(&server, "hung-up connections close their pipes", |n| {
        n == baseline
    });
    // Still serving, by splice.
    let mut c = raw_unix(&server, "default");
    for k in 0..32u64 {
        c.request(READ, 0, 500 + k, k * u64::from(len), len);
    }
    check_replies(&mut c, 500, 32, len as usize, &[0x5a]);
    drop((c, w));
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
