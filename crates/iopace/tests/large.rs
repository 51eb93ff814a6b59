//! Requests past 32 MiB, interleaved with small ones and FLUSH, read back
//! exactly what was written: a raw client in each reply style (simple,
//! structured, extended headers), qemu-io (qemu 10 negotiates extended
//! headers), and one 1 GiB WRITE and READ with extended headers. The pool is
//! far smaller than one request: they can only stream.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::*;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;
const FLAG_FUA: u16 = 1;
const FLAG_NO_HOLE: u16 = 2;
const FLAG_FAST_ZERO: u16 = 1 << 4;
const MIB: u64 = 1 << 20;
/// 8 MiB of buffers for requests of up to 1 GiB.
const SMALL_POOL: &str = "num_shared_buffers = 64\nbuf_cache_size = 8";
/// One sparse 8 GiB RAM export: room for requests past 4 GiB.
const BIG_MALLOC: &str = "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"8GiB\"\n\n\
                          [[export]]\nname = \"default\"\nbdev = \"m0\"\n";

/// 2 MiB of pseudo-random bytes that every round's data is cut from.
fn base() -> &'static [u8] {
    static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        (0..2 * MIB / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    })
}

/// The bytes a round wrote at `offset` (at most 1 MiB of them): cut from
/// the base at the offset, with every 4 KiB block stamped with its offset
/// and the round's seed (0: zeros), so a reader checks any range without a
/// copy and a block from elsewhere or from another round shows.
fn pattern(buf: &mut [u8], offset: u64, seed: u64) {
    assert!(buf.len() as u64 <= MIB);
    if seed == 0 {
        buf.fill(0);
        return;
    }
    let start = (offset % MIB) as usize;
    buf.copy_from_slice(&base()[start..start + buf.len()]);
    let mut block = offset.next_multiple_of(4096);
    while block + 8 <= offset + buf.len() as u64 {
        let at = (block - offset) as usize;
        let stamp = block ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        buf[at..at + 8].copy_from_slice(&stamp.to_le_bytes());
        block += 4096;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Simple,
    Structured,
    Extended,
}

/// A raw client that streams payloads and checks READ data as it arrives.
struct Client {
    s: UnixStream,
    style: Style,
    /// READs in flight: cookie -> (offset, length, seed) they must return.
    reads: HashMap<u64, (u64, u64, u64)>,
    /// Reply chunk types seen per cookie.
    types: HashMap<u64, Vec<u16>>,
    errors: HashMap<u64, u32>,
}

fn be(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| v << 8 | u64::from(x))
}

impl Client {
    fn connect(server: &Server, style: Style) -> Client {
        let s = UnixStream::connect(&server.sock).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut raw = RawClient { s };
        raw.greet();
        if style != Style::Simple {
            raw.option(if style == Style::Extended { 11 } else { 8 }, &[]);
            assert_eq!(raw.option_reply().1, 1, "{style:?} acknowledged");
            let mut meta = 7u32.to_be_bytes().to_vec();
            meta.extend_from_slice(b"default");
            meta.extend_from_slice(&1u32.to_be_bytes());
            meta.extend_from_slice(&15u32.to_be_bytes());
            meta.extend_from_slice(b"base:allocation");
            raw.option(10, &meta);
            assert_eq!(raw.option_reply().1, 4, "base:allocation");
            assert_eq!(raw.option_reply().1, 1);
        }
        raw.go("default");
        Client {
            s: raw.s,
            style,
            reads: HashMap::new(),
            types: HashMap::new(),
            errors: HashMap::new(),
        }
    }

    /// A request header; a READ's expected data is remembered by cookie.
    fn send(&mut self, cmd: u16, cookie: u64, offset: u64, len: u64, seed: u64) {
        // Extended WRITEs say they carry their payload.
        let ext = self.style == Style::Extended;
        let flags: u16 = if ext && cmd == CMD_WRITE { 1 << 5 } else { 0 };
        self.send_flagged(cmd, flags, cookie, offset, len, seed);
    }

    /// As [`Client::send`], with the command flags given.
    fn send_flagged(
        &mut self,
        cmd: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u64,
        seed: u64,
    ) {
        let ext = self.style == Style::Extended;
        let magic: u32 = if ext { 0x21e4_1c71 } else { 0x2560_9513 };
        let mut m = magic.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&cmd.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        if ext {
            m.extend_from_slice(&len.to_be_bytes());
        } else {
            m.extend_from_slice(&u32::try_from(len).expect("compact").to_be_bytes());
        }
        self.s.write_all(&m).expect("request");
        if cmd == CMD_READ {
            self.reads.insert(cookie, (offset, len, seed));
        }
    }

    /// A WRITE: its header, then `len` bytes of the pattern, 1 MiB at a time.
    fn write(&mut self, cookie: u64, offset: u64, len: u64, seed: u64) {
        self.send(CMD_WRITE, cookie, offset, len, seed);
        let mut buf = vec![0u8; MIB as usize];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(MIB) as usize;
            pattern(&mut buf[..n], offset + at, seed);
            self.s.write_all(&buf[..n]).expect("payload");
            at += n as u64;
        }
    }

    /// Reads `len` bytes of READ data for `cookie` that belong at
    /// `at`, checking them against the pattern.
    fn check_data(&mut self, cookie: u64, at: u64, len: u64) {
        let (offset, total, seed) = self.reads[&cookie];
        assert!(
            at >= offset && at + len <= offset + total,
            "data out of range"
        );
        let cap = len.min(MIB) as usize;
        let (mut got, mut want) = (vec![0u8; cap], vec![0u8; cap]);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(MIB) as usize;
            self.s.read_exact(&mut got[..n]).expect("read data");
            pattern(&mut want[..n], at + done, seed);
            assert!(
                got[..n] == want[..n],
                "cookie {cookie}: wrong data at {}",
                at + done
            );
            done += n as u64;
        }
    }

    /// Reads replies until one ends (a simple reply, or a chunk with
    /// DONE); returns its cookie and error.
    fn reply(&mut self) -> (u64, u32) {
        loop {
            if let Some(done) = self.chunk() {
                return done;
            }
        }
    }

    /// Reads one simple reply or chunk: the reply once it is done.
    fn chunk(&mut self) -> Option<(u64, u32)> {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).expect("reply magic");
        if be(&m) == 0x6744_6698 {
            let mut r = [0u8; 12];
            self.s.read_exact(&mut r).expect("simple reply");
            let (error, cookie) = (be(&r[..4]) as u32, be(&r[4..]));
            if let Some(&(offset, len, _)) = self.reads.get(&cookie).filter(|_| error == 0) {
                self.check_data(cookie, offset, len);
            }
            return Some((cookie, error));
        }
        let ext = be(&m) == 0x6e8a_278c;
        assert!(ext || be(&m) == 0x668e_33ef, "reply magic {m:x?}");
        let mut h = vec![0u8; if ext { 28 } else { 16 }];
        self.s.read_exact(&mut h).expect("chunk header");
        let (flags, typ, cookie) = (be(&h[..2]), be(&h[2..4]) as u16, be(&h[4..12]));
        let len = be(&h[h.len() - if ext { 8 } else { 4 }..]);
        self.types.entry(cookie).or_default().push(typ);
        if typ == 1 {
            let mut o = [0u8; 8];
            self.s.read_exact(&mut o).expect("data offset");
            self.check_data(cookie, be(&o), len - 8);
        } else {
            let mut p = vec![0u8; len as usize];
            self.s.read_exact(&mut p).expect("chunk payload");
            if typ & 0x8000 != 0 {
                self.errors.insert(cookie, be(&p[..4]) as u32);
            }
        }
        if flags & 1 == 0 {
            return None;
        }
        Some((cookie, self.errors.remove(&cookie).unwrap_or(0)))
    }

    /// Collects `n` replies; every one must succeed.
    fn all_ok(&mut self, n: usize) {
        let mut got: Vec<(u64, u32)> = (0..n).map(|_| self.reply()).collect();
        got.sort();
        assert!(got.iter().all(|r| r.1 == 0), "{:?}: {got:?}", self.style);
    }
}

#[test]
fn requests_of_40_to_64_mib_with_small_ones_and_flush_read_back() {
    let server = Server::start_with(MALLOC_EXPORTS, SMALL_POOL);
    // 40 MiB, the conformance suite's 47.6 MiB, and 64 MiB (the default maximum).
    let sizes = [40 * MIB, 12_186 * 4096, 64 * MIB];
    for (round, style) in [Style::Simple, Style::Structured, Style::Extended]
        .into_iter()
        .enumerate()
    {
        let mut c = Client::connect(&server, style);
        for (i, &len) in sizes.iter().enumerate() {
            let seed = (round * 10 + i + 1) as u64;
            let (big, small) = (i as u64 * 128 * MIB, 400 * MIB + i as u64 * 4096);
            c.write(1, big, len, seed);
            c.write(2, small, 4096, seed + 100);
            c.send(CMD_FLUSH, 3, 0, 0, 0);
            c.all_ok(3);
            c.send(CMD_READ, 4, big, len, seed);
            c.send(CMD_READ, 5, small, 4096, seed + 100);
            c.send(CMD_READ, 6, big + len - 4096, 4096, seed);
            c.send(CMD_READ, 7, big + len, 8192, 0);
            c.all_ok(4);
        }
    }
    server.assert_quiescent(64);
    assert!(server.stop().0.success());
}

#[test]
fn one_gib_with_extended_headers_reads_back() {
    let buffers = format!("{SMALL_POOL}\nmax_request_size = \"1G\"");
    let server = Server::start_with(BIG_MALLOC, &buffers);
    let mut c = Client::connect(&server, Style::Extended);
    let (big, len) = (1 << 30, 1 << 30);
    c.write(1, big, len, 7);
    c.write(2, 0, 4096, 8);
    c.send(CMD_FLUSH, 3, 0, 0, 0);
    c.all_ok(3);
    c.send(CMD_READ, 4, big, len, 7);
    c.send(CMD_READ, 5, 0, 4096, 8);
    // A 64-bit effect length: answered, for what the export's devices take.
    c.send(CMD_BLOCK_STATUS, 6, 0, 6 << 30, 0);
    c.all_ok(3);
    // A streamed READ: one OFFSET_DATA chunk per 128 KiB piece.
    assert_eq!(c.types[&4], vec![1; 8192], "an OFFSET_DATA chunk per piece");
    assert_eq!(c.types[&6], vec![6], "BLOCK_STATUS_EXT");
    server.assert_quiescent(64);
    assert!(server.stop().0.success());
}

/// Writes 4 KiB of seed `seed` at each of `at` and checks they read back.
fn stamp(c: &mut Client, at: &[u64], seed: u64) {
    for (i, &o) in at.iter().enumerate() {
        c.write(i as u64 + 1, o, 4096, seed);
    }
    c.all_ok(at.len());
    for (i, &o) in at.iter().enumerate() {
        c.send(CMD_READ, i as u64 + 1, o, 4096, seed);
    }
    c.all_ok(at.len());
}

/// Reads 4 KiB at each of `at`: zeros, as the read checks.
fn reads_zeros(c: &mut Client, at: &[u64]) {
    for (i, &o) in at.iter().enumerate() {
        c.send(CMD_READ, 100 + i as u64, o, 4096, 0);
    }
    c.all_ok(at.len());
}

#[test]
fn write_zeroes_and_trim_of_5_gib_are_served_in_one_request() {
    let server = Server::start_with(BIG_MALLOC, SMALL_POOL);
    let mut c = Client::connect(&server, Style::Extended);
    let five = 5u64 << 30;
    // Either side of each 4 GiB - 4 KiB piece's end, and the range's ends.
    let at = [0, 0xffff_e000, 0xffff_f000, five - 4096, five];
    let flag_sets = [0, FLAG_FUA, FLAG_FAST_ZERO, FLAG_FUA | FLAG_FAST_ZERO];
    for (round, flags) in flag_sets.into_iter().enumerate() {
        stamp(&mut c, &at, round as u64 + 1);
        c.send_flagged(CMD_WRITE_ZEROES, flags, 9, 0, five, 0);
        assert_eq!(c.reply(), (9, 0), "WRITE_ZEROES of 5 GiB, flags {flags:#x}");
        reads_zeros(&mut c, &at[..4]);
        // Past the range: untouched.
        c.send(CMD_READ, 10, five, 4096, round as u64 + 1);
        c.all_ok(1);
    }
    stamp(&mut c, &at, 7);
    c.send_flagged(CMD_TRIM, FLAG_FUA, 11, 0, five, 0);
    assert_eq!(c.reply(), (11, 0), "TRIM of 5 GiB");
    reads_zeros(&mut c, &at[..4]);
    // NO_HOLE on a smaller range (the RAM it may allocate stays small).
    stamp(&mut c, &at[..2], 8);
    c.send_flagged(
        CMD_WRITE_ZEROES,
        FLAG_NO_HOLE,
        12,
        0,
        0xffff_f000 + (1 << 20),
        0,
    );
    assert_eq!(c.reply(), (12, 0), "WRITE_ZEROES with NO_HOLE");
    reads_zeros(&mut c, &at[..3]);
    // The whole export in one request; one past its end fails as a whole.
    c.send(CMD_TRIM, 13, 0, 8 << 30, 0);
    assert_eq!(c.reply(), (13, 0), "TRIM of the whole 8 GiB");
    c.send(CMD_WRITE_ZEROES, 14, 4096, 8 << 30, 0);
    assert_eq!(c.reply(), (14, proto::ENOSPC), "WRITE_ZEROES past the end");
    c.send(CMD_BLOCK_STATUS, 15, 0, 8 << 30, 0);
    c.all_ok(1);
    server.assert_quiescent(64);
    assert!(server.stop().0.success());
}

/// Runs qemu-io's `cmds` on the server's default export with the trace
/// event `trace` on: its stdout and stderr.
fn qemu_io(server: &Server, trace: &str, cmds: &[&str]) -> (String, String) {
    let uri = server.unix_uri("default");
    let mut args = vec!["--trace", trace, "-f", "raw", &uri];
    for c in cmds {
        args.extend(["-c", c]);
    }
    let out = run(
        Command::new("qemu-io").args(&args),
        Duration::from_secs(120),
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn qemu_io_with_extended_headers_reads_back_large_requests() {
    require("qemu-io", "qemu-utils");
    let server = Server::start_with(MALLOC_EXPORTS, SMALL_POOL);
    let cmds = [
        "write -P 0x5a 64M 48M",
        "write -P 0x11 0 4k",
        "flush",
        "write -P 0x6b 128M 40M",
        "read -P 0x5a 64M 48M",
        "read -P 0x11 0 4k",
        "read -P 0x6b 128M 40M",
        "read -P 0 168M 4k",
    ];
    let (stdout, stderr) = qemu_io(&server, "nbd_receive_option_reply", &cmds);
    assert!(
        stderr.contains("(extended headers), type 1 (ack)"),
        "extended headers not negotiated:\n{stderr}"
    );
    assert!(!stdout.contains("fail"), "{stdout}");
    assert_eq!(stdout.matches("read ").count(), 4, "{stdout}");
    server.assert_quiescent(64);
}

#[test]
fn qemu_io_zeroes_5_gib_in_one_request() {
    require("qemu-io", "qemu-utils");
    // RAM, and a sparse file on a disk filesystem (its pieces go through
    // io_uring's fallocate).
    qemu_io_zeroes_5_gib(&Server::start_with(BIG_MALLOC, SMALL_POOL));
    // Without -u the zeroes must be allocated (NBD_CMD_FLAG_NO_HOLE): the
    // file half needs 5 GiB of real space, and ENOSPC is then the right reply.
    let free = free_bytes("/var/tmp");
    if free < 6 << 30 {
        eprintln!(
            "file half skipped: /var/tmp has {} MiB free, it needs 6 GiB",
            free >> 20
        );
        return;
    }
    let (_img, file) = file_export("iopace-it-zero", "/var/tmp", "8GiB");
    qemu_io_zeroes_5_gib(&Server::start_with(&file, SMALL_POOL));
}

fn qemu_io_zeroes_5_gib(server: &Server) {
    // -n: one request, no fallback to writing zeros (qemu-io's limit of
    // 2 GiB per command applies only without it).
    let cmds = [
        "write -P 0x5a 0 4k",
        "write -P 0x5a 4G 4k",
        "write -z -n 0 5G",
        "read -P 0 0 4k",
        "read -P 0 4G 4k",
        "write -P 0x6b 4G 4k",
        "write -z -u -n 0 5G",
        "read -P 0 4G 4k",
    ];
    let (stdout, stderr) = qemu_io(server, "nbd_send_request", &cmds);
    let zeroes = ".len = 5368709120, .cookie = 1, .flags = 0x1";
    assert_eq!(
        stderr.matches(zeroes).count(),
        2,
        "one request each:\n{stderr}"
    );
    assert!(
        !stdout.contains("fail") && !stdout.contains("error"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("wrote 5368709120/5368709120").count(),
        2,
        "{stdout}"
    );
    server.assert_quiescent(64);
}

#[test]
fn clients_vanishing_mid_stream_return_every_buffer() {
    let server = Server::start_with(MALLOC_EXPORTS, SMALL_POOL);
    for style in [Style::Simple, Style::Extended] {
        // Mid-READ: a few bytes of a 64 MiB reply taken, then gone.
        let mut c = Client::connect(&server, style);
        c.send(CMD_READ, 1, 0, 64 * MIB, 0);
        let mut some = [0u8; 4096];
        c.s.read_exact(&mut some).expect("the reply starts");
        drop(c);
        // Mid-WRITE: half of a 64 MiB payload, then gone.
        let mut c = Client::connect(&server, style);
        c.send(CMD_WRITE, 2, 0, 64 * MIB, 1);
        c.s.write_all(&vec![7u8; 32 << 20])
            .expect("half the payload");
        drop(c);
    }
    server.assert_quiescent(64);
    roundtrip_ok(&server);
}
