//! Hostile and broken clients: each gets its spec error or a closed
//! connection, the target keeps serving others, and every buffer comes back.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use proto::{EINVAL, ENOSPC, ENOTSUP, EOVERFLOW, EPERM};

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_FLAG_FUA: u16 = 1;
const EXPORT: u64 = 512 << 20;

/// True when the server closed the connection (EOF or reset).
fn closed(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // drain anything queued before the close
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn out_of_range_and_oversized_requests_get_spec_errors() {
    let server = Server::malloc();
    let mut c = raw_unix(&server, "default");
    c.request(CMD_READ, 0, 1, EXPORT - 4096, 8192);
    assert_eq!(c.simple_reply(), (EINVAL, 1), "read past the end");
    c.request(CMD_WRITE, 0, 2, EXPORT, 4096);
    c.s.write_all(&[0u8; 4096]).expect("payload");
    assert_eq!(c.simple_reply(), (ENOSPC, 2), "write past the end");
    c.request(CMD_READ, 0, 3, 0, (64 << 20) + 4096);
    assert_eq!(
        c.simple_reply(),
        (EOVERFLOW, 3),
        "read over the 64 MiB maximum"
    );
    c.request(CMD_WRITE, 0, 4, 0, (64 << 20) + 4096);
    c.s.write_all(&vec![0u8; (64 << 20) + 4096])
        .expect("oversized payload is discarded");
    assert_eq!(c.simple_reply(), (EOVERFLOW, 4));
    c.request(99, 0, 5, 0, 0);
    assert_eq!(c.simple_reply(), (EINVAL, 5), "unknown command");
    c.request(CMD_READ, 1 << 9, 6, 0, 4096);
    assert_eq!(c.simple_reply(), (EINVAL, 6), "unknown flag");
    // The same connection still works after all that.
    c.request(CMD_WRITE, 0, 7, 4096, 4);
    c.s.write_all(b"abcd").expect("payload");
    assert_eq!(c.simple_reply(), (0, 7));
    c.request(CMD_READ, 0, 8, 4096, 4);
    assert_eq!(c.simple_reply(), (0, 8));
    assert_eq!(c.read_exact(4), b"abcd");
    server.assert_quiescent(256);
}

#[test]
fn read_only_export_rejects_writes_with_eperm() {
    let server = Server::malloc();
    let mut c = raw_tcp(&server, "ro");
    c.request(CMD_WRITE, 0, 1, 0, 512);
    c.s.write_all(&[1u8; 512]).expect("payload");
    assert_eq!(c.simple_reply(), (EPERM, 1));
    // Not advertised on a read-only export, but the spec's answer to "a
    // write or trim request on a read-only export" is EPERM (as nbdkit's).
    c.request(CMD_TRIM, 0, 2, 0, 4096);
    assert_eq!(c.simple_reply(), (EPERM, 2), "trim");
    c.request(CMD_WRITE_ZEROES, 0, 4, 0, 4096);
    assert_eq!(c.simple_reply(), (EPERM, 4), "write zeroes");
    c.request(CMD_WRITE, CMD_FLAG_FUA, 5, 0, 512);
    c.s.write_all(&[1u8; 512]).expect("payload");
    assert_eq!(c.simple_reply(), (EPERM, 5), "write with FUA");
    c.request(CMD_READ, 0, 3, 0, 512);
    assert_eq!(c.simple_reply(), (0, 3));
    assert_eq!(c.read_exact(512), vec![0u8; 512]);
}

#[test]
fn bad_magic_closes_only_that_connection() {
    let server = Server::malloc();
    // In the handshake.
    let mut s = UnixStream::connect(&server.sock).expect("connect");
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).expect("greeting");
    s.write_all(&3u32.to_be_bytes()).expect("flags");
    s.write_all(&[0xde; 16]).expect("garbage option");
    assert!(closed(&mut s), "bad option magic must close the connection");
    // In transmission.
    let mut c = raw_unix(&server, "default");
    c.s.write_all(&[0xab; 28]).expect("garbage request");
    assert!(
        closed(&mut c.s),
        "bad request magic must close the connection"
    );
    roundtrip_ok(&server);
}

#[test]
fn unknown_option_gets_unsup_and_negotiation_continues() {
    let server = Server::malloc();
    let s = UnixStream::connect(&server.sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut c = RawClient { s };
    c.greet();
    c.option(4242, b"whatever");
    let (opt, typ, _) = c.option_reply();
    assert_eq!((opt, typ), (4242, 0x8000_0001), "NBD_REP_ERR_UNSUP");
    assert_eq!(c.go("default"), EXPORT);
    c.request(CMD_READ, 0, 9, 0, 16);
    assert_eq!(c.simple_reply(), (0, 9));
}

#[test]
fn client_vanishing_mid_write_returns_every_buffer() {
    let server = Server::start_with(
        MALLOC_EXPORTS,
        "num_shared_buffers = 64\nbuf_cache_size = 4",
    );
    for round in 0..5 {
        let mut c = raw_unix(&server, "default");
        // Several writes in flight: one complete, one half-sent, reads queued.
        for i in 0..8u64 {
            c.request(CMD_READ, 0, 100 + i, i * 131072, 131072);
        }
        c.request(CMD_WRITE, 0, 1, 0, 1 << 20);
        // The replies go unread, so the pacer may rightly stop taking the
        // payload (backpressure); send what the socket takes, then vanish.
        c.s.set_write_timeout(Some(std::time::Duration::from_secs(1)))
            .expect("timeout");
        let _ = c.s.write_all(&vec![7u8; 300_000]);
        drop(c);
        // And a TCP client that vanishes after a header only.
        let mut t = raw_tcp(&server, "default");
        t.request(CMD_WRITE, 0, 2, 0, 4 << 20);
        drop(t);
        roundtrip_ok(&server);
        server.assert_quiescent(64);
        let _ = round;
    }
}

#[test]
fn many_requests_beyond_buffers_do_not_deadlock() {
    // 4 buffers of 128 KiB and a zero cache: the pool is tiny, requests queue.
    let server = Server::start_with(MALLOC_EXPORTS, "num_shared_buffers = 4\nbuf_cache_size = 0");
    let mut c = raw_unix(&server, "default");
    let n = 64u64;
    for i in 0..n {
        c.request(CMD_READ, 0, i, i * 65536, 131072);
    }
    let mut seen = 0;
    for _ in 0..n {
        let (err, cookie) = c.simple_reply();
        assert_eq!(err, 0);
        assert!(cookie < n);
        c.read_exact(131072);
        seen += 1;
    }
    assert_eq!(seen, n);
    server.assert_quiescent(4);
}

/// WRITE_ZEROES with NO_HOLE and FAST_ZERO on a file whose filesystem can
/// only punch holes (tmpfs, btrfs) would fall back to writing zeros: the
/// spec wants a quick ENOTSUP instead, so the client picks its own way.
#[test]
fn fast_zero_that_could_only_write_zeros_gets_enotsup() {
    let (_img, body) = file_export("iopace-it-fastzero", "/dev/shm", "16MiB");
    let server = Server::start(&body);
    let mut c = raw_unix(&server, "default");
    const CMD_WRITE_ZEROES: u16 = 6;
    const NO_HOLE: u16 = 1 << 1;
    const FAST_ZERO: u16 = 1 << 4;
    c.request(CMD_WRITE_ZEROES, NO_HOLE | FAST_ZERO, 1, 0, 1 << 20);
    assert_eq!(c.simple_reply(), (ENOTSUP, 1), "NO_HOLE | FAST_ZERO");
    c.request(CMD_WRITE_ZEROES, FAST_ZERO, 2, 0, 1 << 20);
    assert_eq!(c.simple_reply(), (0, 2), "FAST_ZERO alone punches a hole");
    c.request(CMD_WRITE_ZEROES, NO_HOLE, 3, 0, 1 << 20);
    assert_eq!(c.simple_reply(), (0, 3), "NO_HOLE alone writes zeros");
    server.assert_quiescent(256);
}

/// A RAM disk larger than the RAM it may take (`max_resident`) is thin:
/// writes that need more get ENOSPC, the server keeps serving, and
/// trimming gives the RAM back.
#[test]
fn a_full_ram_disk_answers_enospc_and_trim_makes_room() {
    let body = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"64GiB\"\n\
                max_resident = \"1MiB\"\n\
                [[export]]\nname = \"default\"\nbdev = \"m\"\n";
    let server = Server::start(body);
    let mut c = raw_unix(&server, "default");
    let mib = vec![7u8; 1 << 20];
    c.request(CMD_WRITE, 0, 1, 0, 1 << 20);
    c.s.write_all(&mib).expect("payload");
    assert_eq!(c.simple_reply(), (0, 1), "1 MiB fits");
    c.request(CMD_WRITE, 0, 2, 32 << 30, 4096);
    c.s.write_all(&mib[..4096]).expect("payload");
    assert_eq!(c.simple_reply(), (ENOSPC, 2), "no RAM left for it");
    c.request(CMD_TRIM, 0, 3, 0, 1 << 20);
    assert_eq!(c.simple_reply(), (0, 3));
    c.request(CMD_WRITE, 0, 4, 32 << 30, 4096);
    c.s.write_all(&mib[..4096]).expect("payload");
    assert_eq!(c.simple_reply(), (0, 4), "room again after the trim");
    c.request(CMD_READ, 0, 5, 32 << 30, 4096);
    assert_eq!(c.simple_reply(), (0, 5));
    assert_eq!(c.read_exact(4096), mib[..4096]);
    server.assert_quiescent(256);
}
