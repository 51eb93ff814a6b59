//! A fake network and device for driving the engine in tests: clients are
//! byte streams, posted recvs, sends and device IOs wait until the test
//! completes them, in any order and any chunking.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bdev::{IoRequest, Prep};
use pace::pacer::Pacer;
use pace::Nanos;
use pool::{PoolConfig, SharedPool};
use proto::{Command, Request};

use super::*;

pub const BUF_SIZE: u32 = 4096;

/// An engine over a small pool and one 1 MiB malloc export.
pub fn engine(mode: &str, buffers: u32, timeouts: Timeouts) -> Engine {
    engine_with(mode, buffers, timeouts, 0)
}

/// As [`engine`], with an emulated device delay of `delay_us` on average
/// (none for 0): completions wait in the engine's delay timers.
pub fn engine_with(mode: &str, buffers: u32, timeouts: Timeouts, delay_us: u32) -> Engine {
    let pool = PoolConfig::large_only(buffers, BUF_SIZE, 2);
    engine_pool(mode, pool, timeouts, delay_us)
}

/// As [`engine_with`], over the pool `pool` (e.g. with small classes).
pub fn engine_pool(mode: &str, pool: PoolConfig, timeouts: Timeouts, delay_us: u32) -> Engine {
    let (bdev, delay) = match delay_us {
        0 => ("m0", String::new()),
        us => (
            "slow",
            format!(
                "[[bdev]]\nname = \"slow\"\nkind = \"delay\"\nbase = \"m0\"\n\
                 read_avg_us = {us}\nwrite_avg_us = {us}\n\n"
            ),
        ),
    };
    let body = format!(
        "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"1M\"\n\n{delay}\
         [[export]]\nname = \"default\"\nbdev = \"{bdev}\"\n\n"
    );
    engine_over_pool(&body, mode, pool, timeouts)
}

/// An engine serving the bdevs and exports of `body` (config text).
pub fn engine_over(body: &str, mode: &str, buffers: u32, timeouts: Timeouts) -> Engine {
    engine_over_pool(
        body,
        mode,
        PoolConfig::large_only(buffers, BUF_SIZE, 2),
        timeouts,
    )
}

fn engine_over_pool(body: &str, mode: &str, pool: PoolConfig, timeouts: Timeouts) -> Engine {
    let text = format!(
        "{body}\n[buffers]\nnum_shared_buffers = {}\nbuffer_size = \"{}\"\nbuf_cache_size = {}\n\
         num_small_buffers = {}\nsmall_buffer_size = \"{}\"\n\n[pacing]\nmode = \"{mode}\"\n",
        pool.num_shared_buffers,
        pool.buffer_size,
        pool.buf_cache_size,
        pool.num_small_buffers,
        pool.small_buffer_size.max(4096),
    );
    let loaded = config::Config::parse(&text, "test.toml").expect("test config");
    let catalog = Arc::new(Catalog::build(&loaded).expect("catalog"));
    let pool = SharedPool::new(loaded.config.buffers.pool()).expect("pool");
    let bufs = pool.register_reactor(Box::new(|| {}));
    let pacer = Pacer::new(
        catalog.pacing.clone(),
        catalog.devices.len(),
        pool.buffer_size(),
        None,
        0,
    );
    let settings = EngineSettings {
        id: 0,
        max_requests: 16,
        drain_timeout: 1_000_000_000,
        timeouts,
        payload_cap: 2,
    };
    Engine::new(settings, catalog, bufs, pacer, 0)
}

pub const TIMEOUTS: Timeouts = Timeouts {
    handshake: 10_000_000_000,
    idle: 300_000_000_000,
    payload: 30_000_000_000,
};

/// The client's side of one connection.
#[derive(Default)]
pub struct Client {
    /// Bytes written by the client, not yet received by the engine.
    pub to_server: VecDeque<u8>,
    /// Bytes the engine sent.
    pub from_server: Vec<u8>,
    /// The client has shut its writing side: the engine reads EOF.
    pub eof: bool,
    /// A posted recv: where and how much.
    pub recv: Option<(*mut u8, usize)>,
    /// A posted send.
    pub send: Option<*const libc::msghdr>,
    /// The engine asked to start TLS (the fake has none: a test reports).
    pub start_tls: bool,
    pub closed: bool,
}

/// The engine, its clients and its device, with every pending operation.
pub struct Net {
    pub engine: Engine,
    pub now: Nanos,
    pub clients: HashMap<ConnId, Client>,
    pub ios: Vec<(IoToken, u16, IoRequest)>,
    pub bytes_delivered: u64,
    pub bytes_sent: u64,
    /// Run after every event the engine handles (a property test's books).
    pub after_event: Option<fn(&Net)>,
}

impl Net {
    pub fn new(engine: Engine) -> Net {
        Net {
            engine,
            now: 0,
            clients: HashMap::new(),
            ios: Vec::new(),
            bytes_delivered: 0,
            bytes_sent: 0,
            after_event: None,
        }
    }

    /// Applies the engine's actions to the fake world.
    pub fn pump(&mut self) {
        self.engine.flush();
        let mut actions = Vec::new();
        self.engine.take_actions(&mut actions);
        let mut shut = Vec::new();
        for a in actions {
            match a {
                Action::Recv { conn, buf, len } => {
                    let c = self.clients.get_mut(&conn).expect("recv on a known conn");
                    assert!(c.recv.is_none(), "two recvs posted on {conn:?}");
                    c.recv = Some((buf, len));
                }
                Action::Send { conn, msg } => {
                    let c = self.clients.get_mut(&conn).expect("send on a known conn");
                    assert!(c.send.is_none(), "two sends posted on {conn:?}");
                    c.send = Some(msg);
                }
                Action::Submit { io, export, req } => self.ios.push((io, export, req)),
                Action::Shutdown { conn, read_only } => {
                    if let Some(c) = self.clients.get_mut(&conn) {
                        c.eof = true;
                    }
                    shut.push((conn, read_only));
                }
                Action::StartTls { conn } => {
                    let c = self.clients.get_mut(&conn).expect("TLS on a known conn");
                    assert!(!c.start_tls, "TLS started twice on {conn:?}");
                    c.start_tls = true;
                }
                Action::Close { conn } => {
                    let c = self.clients.get_mut(&conn).expect("close of a known conn");
                    assert!(
                        c.recv.is_none() && c.send.is_none() && !c.start_tls,
                        "{conn:?} closed mid-op"
                    );
                    assert!(!c.closed, "{conn:?} closed twice");
                    c.closed = true;
                }
            }
        }
        for (conn, read_only) in shut {
            self.shut_down(conn, read_only);
        }
        if let Some(check) = self.after_event {
            check(self);
        }
    }

    /// Drives every pending operation to completion, whole, until nothing
    /// moves (time runs on to emulated delays, not to timeouts).
    pub fn run_to_quiet(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            let conns: Vec<ConnId> = self.clients.keys().copied().collect();
            for c in conns {
                moved |= self.deliver(c, usize::MAX);
                moved |= self.take_sent(c, usize::MAX);
            }
            while !self.ios.is_empty() {
                self.complete_io(0);
                moved = true;
            }
            let delayed = self.engine.io.next_held();
            match delayed {
                Some(t) if !moved => self.advance(t.max(self.now) - self.now),
                _ => self.advance(1_000),
            }
            // The advance may have started work (a timer, a grant): quiet
            // only if it left no device IO pending and no recv or send a
            // client could complete (a grant it polled posts the recv of the
            // WRITE piece that waited for the buffer).
            if !moved && delayed.is_none() && self.ios.is_empty() && !self.can_move() {
                return;
            }
        }
        panic!("no quiet after 10000 rounds");
    }

    /// Whether some client's posted recv or send could complete now.
    fn can_move(&self) -> bool {
        (self.clients.values())
            .any(|c| c.send.is_some() || (c.recv.is_some() && (c.eof || !c.to_server.is_empty())))
    }

    /// As the kernel does on shutdown: a pending recv ends (EOF), and on a
    /// full shutdown a pending send fails.
    fn shut_down(&mut self, conn: ConnId, read_only: bool) {
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        let recv = c.recv.take().is_some();
        let send = !read_only && c.send.take().is_some();
        let tls = std::mem::take(&mut c.start_tls);
        if tls {
            // The driver's TLS receive ends as a plain one would.
            self.engine
                .on_tls(self.now, conn, super::TlsOutcome::Failed);
        }
        if recv {
            self.engine.on_recv(self.now, conn, Received::Eof);
        }
        if send {
            self.engine
                .on_send(self.now, conn, Sent::Error(libc::EPIPE));
        }
        if recv || send || tls {
            self.pump();
        }
    }

    pub fn connect(&mut self) -> ConnId {
        self.connect_with(None)
    }

    /// A connection whose handshake began elsewhere (a TLS listener's).
    pub fn connect_with(&mut self, handshake: Option<Box<proto::Handshake>>) -> ConnId {
        let id = self
            .engine
            .accept(self.now, handshake)
            .expect("not draining");
        self.clients.insert(id, Client::default());
        self.pump();
        id
    }

    /// Reports the TLS handshake the engine asked `conn`'s driver for.
    pub fn tls_done(&mut self, conn: ConnId, outcome: super::TlsOutcome) {
        let c = self.clients.get_mut(&conn).expect("a known conn");
        assert!(
            std::mem::take(&mut c.start_tls),
            "no TLS started on {conn:?}"
        );
        self.engine.on_tls(self.now, conn, outcome);
        self.pump();
    }

    pub fn write(&mut self, conn: ConnId, bytes: &[u8]) {
        if let Some(c) = self.clients.get_mut(&conn) {
            c.to_server.extend(bytes);
        }
    }

    /// Completes `conn`'s recv with at most `max` bytes. False if nothing
    /// could complete (no recv, or no bytes and no EOF).
    pub fn deliver(&mut self, conn: ConnId, max: usize) -> bool {
        let Some(c) = self.clients.get_mut(&conn) else {
            return false;
        };
        let Some((buf, len)) = c.recv else {
            return false;
        };
        let n = c.to_server.len().min(len).min(max.max(1));
        let result = if n == 0 {
            if !c.eof {
                return false;
            }
            Received::Eof
        } else {
            for i in 0..n {
                let b = c.to_server.pop_front().expect("counted");
                // SAFETY: the engine posted `len` writable bytes at `buf`
                // and keeps them until this completion; i < n <= len.
                unsafe { *buf.add(i) = b };
            }
            Received::Data(n)
        };
        c.recv = None;
        self.bytes_delivered += n as u64;
        self.engine.on_recv(self.now, conn, result);
        self.pump();
        true
    }

    /// Completes `conn`'s send, taking at most `max` bytes of it.
    pub fn take_sent(&mut self, conn: ConnId, max: usize) -> bool {
        let Some(c) = self.clients.get_mut(&conn) else {
            return false;
        };
        let Some(msg) = c.send.take() else {
            return false;
        };
        let mut left = max.max(1);
        let mut n = 0;
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // this completion.
        let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
        for v in iovs {
            let k = v.iov_len.min(left);
            // SAFETY: each iovec covers iov_len readable bytes.
            let src = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), k) };
            c.from_server.extend_from_slice(src);
            n += k;
            left -= k;
            if left == 0 {
                break;
            }
        }
        self.bytes_sent += n as u64;
        self.engine.on_send(self.now, conn, Sent::Bytes(n));
        self.pump();
        true
    }

    /// Fails `conn`'s pending operations, as a reset connection does.
    pub fn reset(&mut self, conn: ConnId) {
        if let Some(c) = self.clients.get_mut(&conn) {
            c.eof = true;
            let recv = c.recv.take().is_some();
            let send = c.send.take().is_some();
            if recv {
                self.engine
                    .on_recv(self.now, conn, Received::Error(libc::ECONNRESET));
            }
            if send {
                self.engine
                    .on_send(self.now, conn, Sent::Error(libc::EPIPE));
            }
            self.pump();
        }
    }

    /// Completes the `i`-th pending device IO on the real malloc bdev.
    pub fn complete_io(&mut self, i: usize) {
        self.complete_io_as(i, None);
    }

    /// Completes the `i`-th pending device IO, failing it with `fail`.
    pub fn complete_io_as(&mut self, i: usize, fail: Option<u32>) {
        let (io, export, req) = self.ios.swap_remove(i);
        if let Some(errno) = fail {
            self.engine
                .on_io_done(self.now, io, bdev::IoResult::Err(errno));
            self.pump();
            return;
        }
        let dev = self.engine.io.catalog().exports[export as usize]
            .bdev
            .clone();
        // As the reactor: written RAM is lent to the reply, not copied.
        if self.engine.try_lend(self.now, io, &dev, &req) {
            self.pump();
            return;
        }
        // SAFETY: the engine keeps the IO's iovecs and buffers until it
        // hears the IO is done, which is below.
        let result = match unsafe { dev.prepare(&req) } {
            Prep::Done(r) => r,
            Prep::Sqes(_) => panic!("malloc bdevs finish at once"),
        };
        self.engine.on_io_done(self.now, io, result);
        self.pump();
    }

    pub fn advance(&mut self, dt: Nanos) {
        self.now += dt;
        self.engine.tick(self.now);
        self.pump();
    }
}

/// The client's handshake: fixed newstyle, no zeroes, GO for the default export.
pub fn handshake_bytes() -> Vec<u8> {
    let mut m = 3u32.to_be_bytes().to_vec();
    m.extend_from_slice(&0x4948_4156_454f_5054u64.to_be_bytes());
    m.extend_from_slice(&7u32.to_be_bytes());
    m.extend_from_slice(&6u32.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m
}

pub fn request_bytes(command: Command, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let r = Request {
        flags: 0,
        command,
        cookie,
        offset,
        length: u64::from(length),
    };
    proto::encode_request(&mut out, &r, false);
    out
}

/// An extended request header (NBD_OPT_EXTENDED_HEADERS); a WRITE says it
/// carries its payload.
pub fn ext_request_bytes(command: Command, cookie: u64, offset: u64, length: u64) -> Vec<u8> {
    let flags = if command == Command::Write {
        proto::CMD_FLAG_PAYLOAD_LEN
    } else {
        0
    };
    ext_request_flagged(command, flags, cookie, offset, length)
}

/// An extended request header with the command flags given.
pub fn ext_request_flagged(
    command: Command,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u64,
) -> Vec<u8> {
    let r = Request {
        flags,
        command,
        cookie,
        offset,
        length,
    };
    let mut out = Vec::new();
    proto::encode_request(&mut out, &r, true);
    out
}

/// The client's handshake with extended headers and base:allocation, then
/// GO for the default export.
pub fn ext_handshake_bytes() -> Vec<u8> {
    ext_handshake_with(&["base:allocation"])
}

/// The client's handshake with extended headers and the metadata contexts
/// `contexts`, then GO for the default export.
pub fn ext_handshake_with(contexts: &[&str]) -> Vec<u8> {
    let option = |m: &mut Vec<u8>, opt: u32, data: &[u8]| {
        m.extend_from_slice(&0x4948_4156_454f_5054u64.to_be_bytes());
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
    };
    let mut m = 3u32.to_be_bytes().to_vec();
    option(&mut m, proto::OPT_EXTENDED_HEADERS, &[]);
    let mut meta = 7u32.to_be_bytes().to_vec();
    meta.extend_from_slice(b"default");
    meta.extend_from_slice(&(contexts.len() as u32).to_be_bytes());
    for c in contexts {
        meta.extend_from_slice(&(c.len() as u32).to_be_bytes());
        meta.extend_from_slice(c.as_bytes());
    }
    option(&mut m, proto::OPT_SET_META_CONTEXT, &meta);
    let mut go = 7u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"default");
    go.extend_from_slice(&0u16.to_be_bytes());
    option(&mut m, proto::OPT_GO, &go);
    m
}
