//! The engine's property test: random clients (handshakes, READs large and
//! small, WRITEs whose payload comes in pieces or never, junk, hang-ups,
//! stalls), random completion order and time, over a device with and
//! without an emulated delay. After every event the engine handles, its
//! books must balance: buffers, commitments, pieces, requests, pacer IOs
//! and bytes, each counted twice, agree. At the end every client hangs up
//! (or the engine drains), and every connection must close with every
//! buffer, slot and pacer entry returned.

use std::collections::{HashMap, HashSet};

use pace::pool::PoolConfig;
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

/// The engine's books balance: buffers, commitments, pieces, requests,
/// pacer IOs and bytes, each counted twice, agree.
fn check(net: &Net) {
    let e = &net.engine;
    let mut bufs = 0u64;
    let mut per_conn: HashMap<ConnId, (u32, u32, u32)> = HashMap::new();
    for (i, r) in e.reqs.iter().enumerate() {
        if r.state == ReqStage::Free {
            assert!(
                r.bufs.is_empty() && r.pieces.is_empty(),
                "free slot {i} holds data"
            );
            continue;
        }
        let held = r.pieces.iter().filter(|p| p.buf.is_some()).count();
        bufs += (r.bufs.len() + held) as u64;
        assert!(
            e.conn_ref(r.conn).is_some(),
            "request {i} outlived {:?}",
            r.conn
        );
        let entry = per_conn.entry(r.conn).or_default();
        entry.0 += 1;
        entry.1 += e.commitment(ReqId(i as u32));
        if r.streamed() {
            // A streamed READ's window is its own.
            assert!(
                r.pieces_live <= e.payload_cap,
                "request {i} over its window"
            );
            assert!(r.sent_pieces <= r.started && r.started as usize <= r.pieces.len());
        } else {
            // Under the payload cap: pieces still waiting for their payload.
            let awaiting = r.pieces.iter().filter(|p| {
                matches!(
                    p.state,
                    PieceState::Pacing | PieceState::NeedBuffer | PieceState::Filling
                )
            });
            entry.2 += awaiting.count() as u32;
        }
    }
    assert_eq!(e.bufs.in_use(), bufs, "buffers held vs. buffers counted");
    assert_eq!(e.free_reqs.len() + e.requests_in_use(), e.reqs.len());
    let live = e.reqs.iter().filter(|r| r.state != ReqStage::Free).count();
    assert_eq!(e.requests_in_use(), live, "free list vs. slot states");
    assert_eq!(
        e.stats.requests_in_flight(),
        live as u64,
        "state statistics vs. slot states"
    );
    for c in e.conns.iter().flatten() {
        check_conn(e, c, per_conn.get(&c.id).copied().unwrap_or_default());
    }
    check_pacer(e);
    assert_eq!(e.stats.bytes_in, net.bytes_delivered, "bytes received");
    assert_eq!(e.stats.bytes_out, net.bytes_sent, "bytes sent");
}

/// One connection's books against what its requests hold: (requests,
/// commitments, WRITE pieces waiting for their payload).
fn check_conn(e: &Engine, c: &conn::Conn, (n, committed, pieces): (u32, u32, u32)) {
    if let RecvOp::Direct(r) = c.recv {
        // The kernel writes into that buffer: it must still be ours.
        let req = &e.reqs[r.index()];
        let k = req.filling_piece(e.buf_size) as usize;
        assert_eq!(
            req.state,
            ReqStage::Payload,
            "{:?} receives into a dead write",
            c.id
        );
        assert!(
            req.pieces[k].buf.is_some(),
            "{:?} receives into a freed buffer",
            c.id
        );
    }
    let streams = c
        .out
        .iter()
        .filter(|r| e.reqs[r.index()].streamed())
        .count();
    assert_eq!(c.streams_out as usize, streams, "{:?} streams queued", c.id);
    check_turns(e, c);
    assert_eq!(c.requests, n, "{:?} requests", c.id);
    assert_eq!(c.committed, committed, "{:?} commitments", c.id);
    assert_eq!(c.payload_pieces, pieces, "{:?} payload pieces", c.id);
    assert!(
        c.payload_pieces <= e.payload_cap,
        "{:?} over its payload cap",
        c.id
    );
}

/// A connection's READ turns (`turns.rs`) against its requests: the
/// waiting ones are in its queue in order, the pending ones counted, and a
/// stream runs alone.
fn check_turns(e: &Engine, c: &conn::Conn) {
    let ids = (0..e.reqs.len() as u32).map(ReqId);
    let mine: Vec<ReqId> = ids.filter(|r| e.reqs[r.index()].conn == c.id).collect();
    let live = |r: &&ReqId| e.reqs[r.index()].state != ReqStage::Free;
    let deferred = mine
        .iter()
        .filter(live)
        .filter(|r| e.reqs[r.index()].state == ReqStage::Deferred)
        .count();
    assert_eq!(
        c.turns.waiting().count(),
        deferred,
        "{:?} READs deferred",
        c.id
    );
    for r in c.turns.waiting() {
        assert_eq!(e.reqs[r.index()].state, ReqStage::Deferred, "{:?}", c.id);
    }
    let pending: Vec<&ReqId> = mine
        .iter()
        .filter(live)
        .filter(|r| e.read_pending(**r))
        .collect();
    assert_eq!(
        c.turns.pending() as usize,
        pending.len(),
        "{:?} READs pending",
        c.id
    );
    let streams: Vec<ReqId> = pending
        .iter()
        .filter(|r| e.reqs[r.index()].streamed())
        .map(|r| **r)
        .collect();
    assert_eq!(
        c.turns.stream().into_iter().collect::<Vec<_>>(),
        streams,
        "{:?} stream",
        c.id
    );
    if c.turns.stream().is_some() {
        assert_eq!(pending.len(), 1, "{:?}: a stream beside other READs", c.id);
    }
}

/// Where an IO should be, as the pacer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paced {
    Queued,
    InFlight,
    Out,
}

/// The pacer's books against the requests': what each request's state says
/// of its IOs (queued, released, done) is what the pacer holds, and the
/// pacer holds nothing else.
fn check_pacer(e: &Engine) {
    let (mut queued, mut bytes) = (0usize, 0u64);
    let mut see = |token: IoToken, want: Paced, len: u32| {
        let flying = e.pacer.in_flight(token.encode());
        match want {
            Paced::Queued => queued += 1,
            _ => assert_eq!(flying, want == Paced::InFlight, "{token:?} in the pacer"),
        }
        bytes += if flying { u64::from(len) } else { 0 };
    };
    for (i, r) in e.reqs.iter().enumerate() {
        let id = ReqId(i as u32);
        if r.paced {
            let want = match r.state {
                ReqStage::Free | ReqStage::Deferred => Paced::Out,
                ReqStage::Pacing => Paced::Queued,
                _ => Paced::InFlight,
            };
            see(IoToken::whole(id), want, r.len);
        }
        for (k, p) in r.pieces.iter().enumerate() {
            let want = match p.state {
                PieceState::Pacing => Paced::Queued,
                // A streamed READ's piece leaves the pacer when sent.
                PieceState::Ready if r.streamed() => Paced::InFlight,
                PieceState::Idle | PieceState::Ready | PieceState::Done => Paced::Out,
                _ => Paced::InFlight,
            };
            see(
                IoToken::piece(id, k as u32),
                want,
                r.piece_len(k as u32, e.buf_size),
            );
        }
    }
    assert_eq!(e.pacer.queued(), queued, "IOs queued in the pacer");
    assert_eq!(
        e.pacer.bytes_in_flight(),
        bytes,
        "bytes in flight in the pacer"
    );
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
    assert_eq!(w.net.engine.pacer.queued(), 0);
    assert_eq!(w.net.engine.pacer.bytes_in_flight(), 0);
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
