//! The engine's property test: random clients (handshakes, READs large and
//! small, WRITEs whose payload comes in pieces or never, junk, hang-ups,
//! stalls), random completion order and time, over a device with and
//! without an emulated delay. After every event the engine handles, its
//! books must balance: buffers, commitments, pieces, requests, pacer IOs
//! and bytes, each counted twice, agree. At the end every client hangs up
//! (or the engine drains), and every connection must close with every
//! buffer, slot and pacer entry returned.

use std::collections::{HashMap, HashSet};

use pool::PoolConfig;
use proptest::prelude::*;
use proto::Command;

use super::fake::*;
use super::*;

#[derive(Debug, Clone)]
enum Ev {
    /// A client, with extended headers or not.
    Connect {
        ext: bool,
    },
    /// READs, a WRITE (with `sent` per mille of its payload), FLUSH or junk.
    Request {
        conn: usize,
        kind: u8,
        block: u32,
        len: u32,
        sent: u16,
    },
    /// More of an unfinished WRITE payload.
    Payload {
        conn: usize,
        n: usize,
    },
    Deliver {
        conn: usize,
        max: usize,
    },
    TakeSent {
        conn: usize,
        max: usize,
    },
    CompleteIo {
        i: usize,
        fail: bool,
    },
    Eof {
        conn: usize,
    },
    Reset {
        conn: usize,
    },
    /// Time passes: delays expire, stalled clients time out.
    Advance {
        ms: u32,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    let conn = 0usize..8;
    prop_oneof![
        1 => any::<bool>().prop_map(|ext| Ev::Connect { ext }),
        4 => (conn.clone(), 0u8..8, 0u32..200, 0u32..40_000, 0u16..=1000)
            .prop_map(|(conn, kind, block, len, sent)| Ev::Request { conn, kind, block, len, sent }),
        2 => (conn.clone(), 1usize..9000).prop_map(|(conn, n)| Ev::Payload { conn, n }),
        6 => (conn.clone(), 1usize..20_000).prop_map(|(conn, max)| Ev::Deliver { conn, max }),
        5 => (conn.clone(), 1usize..20_000).prop_map(|(conn, max)| Ev::TakeSent { conn, max }),
        5 => (0usize..64, proptest::bool::weighted(0.05)).prop_map(|(i, fail)| Ev::CompleteIo { i, fail }),
        1 => conn.clone().prop_map(|conn| Ev::Eof { conn }),
        1 => conn.prop_map(|conn| Ev::Reset { conn }),
        2 => prop_oneof![0u32..5, 0u32..40_000].prop_map(|ms| Ev::Advance { ms }),
    ]
}

/// Short enough that random runs reach every one of them.
const STALL_TIMEOUTS: Timeouts = Timeouts {
    handshake: 10_000_000_000,
    idle: 60_000_000_000,
    payload: 30_000_000_000,
};

/// The test's side: which connections exist and what each still owes.
struct World {
    net: Net,
    order: Vec<ConnId>,
    /// Clients that negotiated extended headers.
    ext: HashSet<ConnId>,
    /// WRITE payload bytes each client still has to send.
    owed: HashMap<ConnId, usize>,
    cookie: u64,
}

impl World {
    fn pick(&self, i: usize) -> Option<ConnId> {
        let open: Vec<ConnId> = self
            .order
            .iter()
            .copied()
            .filter(|c| !self.net.clients[c].closed)
            .collect();
        (!open.is_empty()).then(|| open[i % open.len()])
    }

    fn request(&mut self, conn: ConnId, kind: u8, block: u32, len: u32, sent: u16) {
        if self.owed.get(&conn).copied().unwrap_or(0) > 0 {
            return;
        }
        self.cookie += 1;
        let offset = u64::from(block) * 4096;
        let ext = self.ext.contains(&conn);
        let header = |cmd, cookie, offset, len: u32| {
            if ext {
                ext_request_bytes(cmd, cookie, offset, u64::from(len))
            } else {
                request_bytes(cmd, cookie, offset, len)
            }
        };
        self.cookie += 2; // room for the READs' cookies
        let bytes = match kind {
            // One to three READs at once: enough to run the pool dry.
            0..=2 => (0..=u64::from(kind))
                .flat_map(|i| header(Command::Read, self.cookie + i, offset, len))
                .collect(),
            3..=5 => {
                let mut b = header(Command::Write, self.cookie, offset, len);
                let now = len as usize * usize::from(sent) / 1000;
                b.extend(std::iter::repeat_n(0xa5, now));
                self.owed.insert(conn, len as usize - now);
                b
            }
            6 => header(Command::Flush, self.cookie, 0, 0),
            _ => vec![0xee; 28], // junk: a protocol error
        };
        let mut all = Vec::new();
        if self.net.clients[&conn].to_server.is_empty() && self.cookie.is_multiple_of(7) {
            all.extend(header(Command::BlockStatus, self.cookie, 0, 4096));
        }
        all.extend(bytes);
        self.net.write(conn, &all);
    }

    fn connect(&mut self, ext: bool) {
        let c = self.net.connect();
        if ext {
            self.net.write(c, &ext_handshake_bytes());
            self.ext.insert(c);
        } else {
            self.net.write(c, &handshake_bytes());
        }
        self.order.push(c);
    }

    fn apply(&mut self, ev: Ev) {
        match ev {
            Ev::Connect { ext } => self.connect(ext),
            Ev::Request {
                conn,
                kind,
                block,
                len,
                sent,
            } => {
                if let Some(c) = self.pick(conn) {
                    self.request(c, kind, block, len, sent);
                }
            }
            Ev::Payload { conn, n } => {
                if let Some(c) = self.pick(conn) {
                    let owed = self.owed.entry(c).or_default();
                    let n = n.min(*owed);
                    *owed -= n;
                    self.net.write(c, &vec![0x5a; n]);
                }
            }
            Ev::Deliver { conn, max } => {
                if let Some(c) = self.pick(conn) {
                    self.net.deliver(c, max);
                }
            }
            Ev::TakeSent { conn, max } => {
                if let Some(c) = self.pick(conn) {
                    self.net.take_sent(c, max);
                }
            }
            Ev::CompleteIo { i, fail } => {
                if !self.net.ios.is_empty() {
                    let i = i % self.net.ios.len();
                    self.net.complete_io_as(i, fail.then_some(proto::EIO));
                }
            }
            Ev::Eof { conn } => {
                if let Some(c) = self.pick(conn) {
                    self.net.clients.get_mut(&c).expect("picked").eof = true;
                }
            }
            Ev::Reset { conn } => {
                if let Some(c) = self.pick(conn) {
                    self.net.reset(c);
                }
            }
            Ev::Advance { ms } => self.net.advance(u64::from(ms) * 1_000_000),
        }
    }
}

/// The engine's books balance ([`Engine::audit`]), and its byte counts
/// match what the fake network moved.
fn check(net: &Net) {
    let e = &net.engine;
    if let Err(broken) = e.audit() {
        panic!("books: {broken}");
    }
    let (bytes_in, bytes_out) = e.bytes_moved();
    assert_eq!(bytes_in, net.bytes_delivered, "bytes received");
    assert_eq!(bytes_out, net.bytes_sent, "bytes sent");
}

/// The run ends: every client hangs up, or the engine drains, and
/// everything pending completes. Every connection closes, with every
/// buffer, slot and pacer entry returned.
fn wind_down(w: &mut World, drain: bool) {
    if drain {
        let now = w.net.now;
        w.net.engine.begin_drain(now);
        w.net.pump();
    }
    for cl in w.net.clients.values_mut() {
        cl.eof = true;
    }
    w.net.run_to_quiet();
    w.net.advance(400_000_000_000);
    w.net.run_to_quiet();
    for (id, cl) in &w.net.clients {
        assert!(
            cl.closed,
            "{id:?} never closed: {:?}",
            w.net.engine.conn_state(*id)
        );
    }
    assert_eq!(w.net.engine.conns_open(), 0);
    assert_eq!(w.net.engine.buffers_in_use(), 0);
    assert_eq!(w.net.engine.requests_in_use(), 0);
    assert_eq!(w.net.engine.io.pacer().queued(), 0);
    assert_eq!(w.net.engine.io.pacer().bytes_in_flight(), 0);
    assert_eq!(w.net.engine.drained(), drain);
}

/// The engine's shape: its pool's size, whether it has small classes, and
/// its device's delay.
#[derive(Debug, Clone, Copy)]
struct Shape {
    buffers: u32,
    classes: bool,
    delay_us: u32,
}

fn run(mode: &str, shape: Shape, drain: bool, evs: Vec<Ev>) {
    let pool = if shape.classes {
        // 16 KiB pieces, and 4 and 8 KiB classes: requests of every size
        // take buffers of each class, and free, cancel and grant across them.
        PoolConfig {
            num_small_buffers: shape.buffers,
            small_buffer_size: 4096,
            ..PoolConfig::large_only(shape.buffers, 16384, 2)
        }
    } else {
        PoolConfig::large_only(shape.buffers, BUF_SIZE, 2)
    };
    let engine = engine_pool(mode, pool, STALL_TIMEOUTS, shape.delay_us);
    let mut net = Net::new(engine);
    net.after_event = Some(check);
    let mut w = World {
        net,
        order: Vec::new(),
        ext: HashSet::new(),
        owed: HashMap::new(),
        cookie: 0,
    };
    for ev in evs {
        w.apply(ev);
    }
    wind_down(&mut w, drain);
}

fn events() -> impl Strategy<Value = Vec<Ev>> {
    proptest::collection::vec(ev(), 1..300)
}

/// A pool that clients share easily or must queue for, and no delay or
/// one that holds completions past some events.
fn shape() -> impl Strategy<Value = Shape> {
    let buffers = prop_oneof![Just(3u32), Just(24u32)];
    let delay_us = prop_oneof![Just(0u32), Just(2_000u32)];
    (buffers, any::<bool>(), delay_us).prop_map(|(buffers, classes, delay_us)| Shape {
        buffers,
        classes,
        delay_us,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn books_balance_unpaced(shape in shape(), drain: bool, evs in events()) {
        run("none", shape, drain, evs);
    }

    #[test]
    fn books_balance_buffers(shape in shape(), drain: bool, evs in events()) {
        run("buffers", shape, drain, evs);
    }

    #[test]
    fn books_balance_auto(shape in shape(), drain: bool, evs in events()) {
        run("auto", shape, drain, evs);
    }
}
