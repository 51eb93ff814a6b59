//! The simulated target and its hosts, advanced event by event.
//!
//! Initiator hosts keep `qd` IOs outstanding each, to devices chosen at
//! random, on one connection per host or one per (host, device). A request
//! reaches the target half an RTT after it is issued, in its connection's
//! order: a WRITE holds the requests behind it until its payload is in.
//!
//! - READ: waits in its reactor's pacer, takes all its buffers from the
//!   pool (the target's policy: cache, shared list, FIFO waiters), is
//!   served by its device, then its reply leaves on its host's port; the
//!   buffers are freed once the reply is sent.
//! - WRITE: as the target's request engine does it (`server::engine`,
//!   `write.rs`), its payload goes in buffer-sized pieces, at most
//!   `PAYLOAD_CAP` live per connection: each piece waits in the pacer, takes
//!   one buffer, receives its bytes across the host's link and the port's
//!   ingress (in stream order), and is written to the device on its own,
//!   which frees its buffer; the short reply goes when every piece is
//!   written. The connection reads the next header once the payload is in.
//!
//! Each port direction shares its bytes fairly between hosts and lets each
//! host's own link hold that host to its rate (see [`crate::ports`]). A port
//! sends at its rate scaled down by a memory/DDIO factor when the bytes held
//! in buffers exceed a cache budget. The reply reaches the host half an RTT
//! after it crossed the host's link, and the host issues its next IO.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use pace::pacer::{DeviceQos, IoKind, PacedIo, Pacer};
use pace::pool::BufId;
use pace::stats::{LatencyHist, TimeAvg};
use pace::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod setup;
mod writes;

use crate::buffers::SimPool;
use crate::devices::Dev;
use crate::ports::{Port, Start};
use crate::scenario::{DeviceKind, RunConfig, Scenario};

/// Width of a slot of the BW STDDEV column.
pub(crate) const SLOT_NS: Nanos = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Dir {
    /// Target to hosts: read data, replies.
    Egress,
    /// Hosts to target: write payloads.
    Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(u32),
    Poll(u32),
    DeviceDone(Token),
    TxDone(u32),
    PieceIn(Token),
    PortFree(Dir, u32),
    PortWake(Dir, u32),
    Reply(u32),
    Rate(u32),
}

/// What the pacer, the pool and the device know an IO by, as the target's
/// `IoToken`: a whole request (its slot), or piece k of a WRITE's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Token(u64);

impl Token {
    fn whole(id: u32) -> Token {
        Token(u64::from(id))
    }

    fn piece(id: u32, k: u32) -> Token {
        Token((u64::from(k) + 1) << 32 | u64::from(id))
    }

    fn id(self) -> u32 {
        self.0 as u32
    }

    fn piece_index(self) -> Option<u32> {
        ((self.0 >> 32) as u32).checked_sub(1)
    }
}

/// Where an IO is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Stage {
    /// Unused slot.
    #[default]
    Free,
    /// Crossing to the target.
    Request,
    /// Received behind a WRITE whose payload is not in yet.
    Backlogged,
    Paced,
    /// Waiting in the pool's FIFO for buffers.
    AwaitBuffers,
    /// A WRITE whose pieces are not all written.
    Payload,
    Device,
    /// Its reply queued on or leaving the port.
    Replying,
    /// Its reply crossing back to the host.
    Returning,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Io {
    pub host: usize,
    conn: usize,
    device: usize,
    kind: Option<IoKind>,
    pub bytes: u32,
    pub issued: Nanos,
    /// When the device started it.
    started: Nanos,
    bufs: Vec<BufId>,
    /// A WRITE's payload pieces.
    write: Option<Box<writes::Payload>>,
    /// When its reply has crossed the host's link.
    link_done: Nanos,
    stage: Stage,
}

impl Io {
    fn kind(&self) -> IoKind {
        self.kind.unwrap_or(IoKind::Read)
    }

    pub fn live(&self) -> bool {
        self.stage != Stage::Free
    }
}

pub(crate) struct Host {
    pub group: usize,
    port: usize,
    rtt: Nanos,
    pub qd: u32,
    devices: Vec<usize>,
    tenant: usize,
    bssplit: Vec<(u32, u32)>,
    read_pct: u32,
    /// Its first connection; it has one, or one per device.
    conn_base: usize,
    one_connection: bool,
    pub delivered: u64,
    /// Bytes per slot, for the BW STDDEV column.
    pub slots: Vec<u64>,
}

/// One connection: its reactor, and the WRITE holding its stream, if any.
struct Conn {
    reactor: usize,
    blocked: Option<u32>,
    backlog: VecDeque<u32>,
    /// WRITE pieces started and not yet written.
    payload_pieces: u32,
}

pub(crate) struct Sim<'a> {
    pub sc: &'a Scenario,
    pub now: Nanos,
    seq: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    pub ios: Vec<Io>,
    free_ios: Vec<u32>,
    pub hosts: Vec<Host>,
    conns: Vec<Conn>,
    pub devs: Vec<Dev>,
    egress: Vec<Port>,
    ingress: Vec<Port>,
    steps: Vec<Option<(Nanos, f64)>>,
    pub pacers: Vec<Pacer>,
    poll_at: Vec<Option<Nanos>>,
    pool: SimPool,
    granted: Vec<(u64, Vec<BufId>)>,
    pub bufs_gauge: TimeAvg,
    rng: SmallRng,
    pub lat: LatencyHist,
    pub group_lat: Vec<LatencyHist>,
    pub device_lat: LatencyHist,
    pub qos: std::sync::Arc<DeviceQos>,
    pub measuring: bool,
    released: Vec<u64>,
    pub issued: u64,
    pub completed: u64,
    /// Names the run in `--trace` lines.
    pub trace_tag: String,
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, run: &RunConfig, qd: u32) -> Sim<'a> {
        let devs = Dev::all(&sc.devices);
        let (hosts, conns) = setup::hosts_and_conns(sc, run, qd, devs.len());
        let mut egress: Vec<Port> = sc
            .ports
            .iter()
            .map(|p| Port::new(p.rate_gbps * 1e9))
            .collect();
        let mut ingress: Vec<Port> = sc
            .ports
            .iter()
            .map(|p| Port::new(p.rate_gbps * 1e9))
            .collect();
        for (i, (h, g)) in hosts.iter().map(|h| (h, &sc.hosts[h.group])).enumerate() {
            let link = g.link_gbps.map(|r| r * 1e9);
            egress[h.port].add_flow(i, link);
            ingress[h.port].add_flow(i, link);
        }
        let qos_targets: Vec<_> = devs
            .iter()
            .map(|d| match d.kind {
                DeviceKind::Nvme => run.qos.or(d.qos),
                DeviceKind::Delay => d.qos,
            })
            .collect();
        let qos = DeviceQos::new(&qos_targets, 0);
        let pacers = setup::pacers(sc, run, &devs, &qos);
        let total = run
            .num_shared_buffers
            .unwrap_or(sc.target.num_shared_buffers);
        let cache = run.buf_cache_size.unwrap_or(sc.target.buf_cache_size);
        Sim {
            sc,
            trace_tag: format!("run={:?} qd={qd}", run.label),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            ios: Vec::new(),
            free_ios: Vec::new(),
            hosts,
            conns,
            devs,
            egress,
            ingress,
            steps: sc
                .ports
                .iter()
                .map(|p| p.step.map(|(ms, g)| (ms * 1_000_000, g * 1e9)))
                .collect(),
            poll_at: vec![None; pacers.len()],
            pool: SimPool::new(total, cache, pacers.len()),
            pacers,
            granted: Vec::new(),
            bufs_gauge: TimeAvg::new(0),
            rng: SmallRng::seed_from_u64(sc.seed ^ u64::from(qd) << 20),
            lat: LatencyHist::new(),
            group_lat: sc.hosts.iter().map(|_| LatencyHist::new()).collect(),
            device_lat: LatencyHist::new(),
            qos,
            measuring: false,
            released: Vec::new(),
            issued: 0,
            completed: 0,
        }
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// Buffers held by requests now.
    pub fn in_use(&self) -> u64 {
        self.pool.in_use
    }

    fn issue(&mut self, host: usize) {
        let h = &self.hosts[host];
        let total: u32 = h.bssplit.iter().map(|b| b.1).sum();
        let mut pick = self.rng.gen_range(0..total.max(1));
        let mut bytes = h.bssplit.first().map_or(131072, |b| b.0);
        for &(b, w) in &h.bssplit {
            if pick < w {
                bytes = b;
                break;
            }
            pick -= w;
        }
        let device = h.devices[self.rng.gen_range(0..h.devices.len())];
        // Reads-only hosts draw nothing more, so their runs stay as seeded.
        let read = h.read_pct >= 100 || self.rng.gen_range(0..100) < h.read_pct;
        let conn = h.conn_base + if h.one_connection { 0 } else { device };
        let io = Io {
            host,
            conn,
            device,
            kind: Some(if read { IoKind::Read } else { IoKind::Write }),
            bytes,
            issued: self.now,
            stage: Stage::Request,
            ..Io::default()
        };
        let arrive = self.now + h.rtt / 2;
        let id = match self.free_ios.pop() {
            Some(i) => {
                self.ios[i as usize] = io;
                i
            }
            None => {
                self.ios.push(io);
                (self.ios.len() - 1) as u32
            }
        };
        self.issued += 1;
        self.at(arrive, Ev::Arrive(id));
    }

    /// The reactor whose connection carries IO `id`.
    fn reactor_of(&self, id: u32) -> usize {
        self.conns[self.ios[id as usize].conn].reactor
    }

    fn set_stage(&mut self, id: u32, stage: Stage) {
        self.ios[id as usize].stage = stage;
    }

    fn schedule_poll(&mut self, reactor: usize, t: Nanos) {
        if self.poll_at[reactor].is_none_or(|p| p > t) {
            self.poll_at[reactor] = Some(t);
            self.at(t, Ev::Poll(reactor as u32));
        }
    }

    fn ddio_factor(&self) -> f64 {
        let t = &self.sc.target;
        let mib = (self.in_use() * u64::from(t.buffer_size)) as f64 / (1u64 << 20) as f64;
        if mib <= t.ddio_budget_mib {
            return 1.0;
        }
        (1.0 - t.ddio_slope * (mib / t.ddio_budget_mib).log2()).max(t.ddio_floor)
    }

    fn port(&mut self, dir: Dir, port: usize) -> &mut Port {
        match dir {
            Dir::Egress => &mut self.egress[port],
            Dir::Ingress => &mut self.ingress[port],
        }
    }

    /// Sends the port's next segment if it is idle.
    fn kick(&mut self, dir: Dir, p: usize) {
        let (now, speed) = (self.now, self.ddio_factor());
        match self.port(dir, p).start(now, speed) {
            Start::Sent(seg) => {
                if let Some(token) = seg.finished {
                    match dir {
                        Dir::Egress => {
                            let id = Token(token).id();
                            self.ios[id as usize].link_done = seg.link_done;
                            self.at(seg.port_done, Ev::TxDone(id));
                        }
                        Dir::Ingress => self.at(seg.link_done, Ev::PieceIn(Token(token))),
                    }
                }
                self.at(seg.port_done, Ev::PortFree(dir, p as u32));
            }
            Start::WaitUntil(t) => {
                let port = self.port(dir, p);
                if port.wake_at.is_none_or(|w| w > t) {
                    port.wake_at = Some(t);
                    self.at(t, Ev::PortWake(dir, p as u32));
                }
            }
            Start::Nothing => {}
        }
    }

    /// A request's header is in: a READ goes into the pacer, a WRITE starts
    /// its payload; unless a WRITE ahead of it still holds the stream.
    fn arrive(&mut self, id: u32) {
        let conn = self.ios[id as usize].conn;
        if self.conns[conn].blocked.is_some() {
            self.conns[conn].backlog.push_back(id);
            self.set_stage(id, Stage::Backlogged);
            return;
        }
        match self.ios[id as usize].kind() {
            IoKind::Read => {
                self.set_stage(id, Stage::Paced);
                let bytes = self.ios[id as usize].bytes;
                self.enqueue(Token::whole(id), bytes);
            }
            IoKind::Write => self.start_write(id),
        }
    }

    /// Hands the pacer IO `token` of `bytes`.
    fn enqueue(&mut self, token: Token, bytes: u32) {
        let io = &self.ios[token.id() as usize];
        let r = self.reactor_of(token.id());
        let paced = PacedIo {
            id: token.0,
            // The connection, as the target passes it: what drains at its own rate.
            flow: io.conn as u64,
            device: io.device,
            tenant: self.hosts[io.host].tenant,
            bytes,
            kind: io.kind(),
            offset: self.rng.gen::<u32>() as u64 * 4096,
        };
        self.pacers[r].enqueue(paced, self.now);
        self.schedule_poll(r, self.now);
    }

    fn poll(&mut self, r: usize) {
        if self.poll_at[r] != Some(self.now) {
            return; // superseded by an earlier poll
        }
        self.poll_at[r] = None;
        let mut out = std::mem::take(&mut self.released);
        self.pacers[r].poll(self.now, &mut out);
        for token in out.drain(..) {
            self.release(Token(token));
        }
        self.released = out;
        if let Some(t) = self.pacers[r].next_wakeup(self.now) {
            self.schedule_poll(r, t.max(self.now + 1));
        }
    }

    /// Released by the pacer: a READ takes all its buffers, a WRITE piece
    /// its one.
    fn release(&mut self, token: Token) {
        let n = match token.piece_index() {
            None => {
                debug_assert_eq!(self.ios[token.id() as usize].stage, Stage::Paced);
                self.ios[token.id() as usize]
                    .bytes
                    .div_ceil(self.sc.target.buffer_size)
            }
            Some(_) => 1,
        };
        self.take_buffers(token, n);
    }

    fn take_buffers(&mut self, token: Token, n: u32) {
        let r = self.reactor_of(token.id());
        let mut granted = std::mem::take(&mut self.granted);
        let got = self.pool.alloc(r, n, token.0, &mut granted);
        self.bufs_gauge.update(self.now, self.in_use());
        match got {
            Some(bufs) => self.got_buffers(token, bufs),
            None if token.piece_index().is_none() => {
                self.set_stage(token.id(), Stage::AwaitBuffers)
            }
            None => {}
        }
        self.hand_out(granted);
    }

    /// Starts the requests the pool just served, in its order.
    fn hand_out(&mut self, mut granted: Vec<(u64, Vec<BufId>)>) {
        for (token, bufs) in granted.drain(..) {
            self.got_buffers(Token(token), bufs);
        }
        self.granted = granted;
    }

    /// Returns buffers IO `id` held.
    fn free_buffers(&mut self, id: u32, bufs: &[BufId]) {
        let r = self.reactor_of(id);
        let mut granted = std::mem::take(&mut self.granted);
        self.pool.free(r, bufs, &mut granted);
        self.bufs_gauge.update(self.now, self.in_use());
        self.hand_out(granted);
    }

    fn got_buffers(&mut self, token: Token, bufs: Vec<BufId>) {
        match token.piece_index() {
            Some(_) => self.piece_granted(token, bufs),
            None => {
                self.ios[token.id() as usize].bufs.extend(bufs);
                self.start_device(token);
            }
        }
    }

    fn start_device(&mut self, token: Token) {
        let bytes = match token.piece_index() {
            None => {
                let io = &mut self.ios[token.id() as usize];
                io.started = self.now;
                io.stage = Stage::Device;
                io.bytes
            }
            Some(k) => self.piece_started(token.id(), k),
        };
        let io = &self.ios[token.id() as usize];
        let (kind, device) = (io.kind(), io.device);
        let done = self.devs[device].start(self.now, kind, bytes);
        self.at(done, Ev::DeviceDone(token));
    }

    fn device_done(&mut self, token: Token) {
        let id = token.id();
        let io = &self.ios[id as usize];
        let (device, kind) = (io.device, io.kind());
        let started = match token.piece_index() {
            None => io.started,
            Some(k) => self.piece_start_time(id, k),
        };
        let latency = self.now - started;
        if self.measuring {
            self.device_lat.record(latency);
        }
        let r = self.reactor_of(id);
        self.pacers[r].on_device_complete(device, kind, latency, self.now);
        match token.piece_index() {
            None => self.send_reply(id, self.ios[id as usize].bytes),
            Some(_) => self.piece_written(token),
        }
    }

    /// Queues IO `id`'s reply (`bytes` on the wire) on its host's port.
    fn send_reply(&mut self, id: u32, bytes: u32) {
        self.set_stage(id, Stage::Replying);
        let host = self.ios[id as usize].host;
        let port = self.hosts[host].port;
        self.egress[port].push(host, Token::whole(id).0, bytes);
        self.kick(Dir::Egress, port);
    }

    /// The reply has left the port: a READ's buffers come back (a WRITE's
    /// pieces returned theirs as each was written).
    fn tx_done(&mut self, id: u32) {
        let r = self.reactor_of(id);
        if self.ios[id as usize].kind() == IoKind::Read {
            let bufs = std::mem::take(&mut self.ios[id as usize].bufs);
            self.free_buffers(id, &bufs);
            self.pacers[r].on_complete(Token::whole(id).0, self.now);
        }
        self.schedule_poll(r, self.now);
        let io = &self.ios[id as usize];
        let back = io.link_done + self.hosts[io.host].rtt / 2;
        self.set_stage(id, Stage::Returning);
        self.at(back, Ev::Reply(id));
    }

    fn reply(&mut self, id: u32) {
        let io = std::mem::take(&mut self.ios[id as usize]);
        debug_assert_eq!(io.stage, Stage::Returning);
        self.free_ios.push(id);
        self.completed += 1;
        if self.measuring {
            let lat = self.now - io.issued;
            self.lat.record(lat);
            let g = self.hosts[io.host].group;
            self.group_lat[g].record(lat);
            let slot = ((self.now - self.sc.warmup_ms * 1_000_000) / SLOT_NS) as usize;
            let h = &mut self.hosts[io.host];
            h.delivered += u64::from(io.bytes);
            if h.slots.len() <= slot {
                h.slots.resize(slot + 1, 0);
            }
            h.slots[slot] += u64::from(io.bytes);
        }
        self.issue(io.host);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(id) => self.arrive(id),
            Ev::Poll(r) => self.poll(r as usize),
            Ev::DeviceDone(token) => self.device_done(token),
            Ev::TxDone(id) => self.tx_done(id),
            Ev::PieceIn(token) => self.piece_in(token),
            Ev::PortFree(dir, p) => {
                self.port(dir, p as usize).done();
                self.kick(dir, p as usize);
            }
            Ev::PortWake(dir, p) => {
                let now = self.now;
                let port = self.port(dir, p as usize);
                if port.wake_at == Some(now) {
                    port.wake_at = None;
                    self.kick(dir, p as usize);
                }
            }
            Ev::Reply(id) => self.reply(id),
            Ev::Rate(p) => {
                if let Some((_, rate)) = self.steps[p as usize].take() {
                    self.egress[p as usize].set_rate(rate);
                    self.ingress[p as usize].set_rate(rate);
                }
            }
        }
    }

    /// Runs the scenario's warm-up and measured stretch.
    pub fn run_events(&mut self) {
        for h in 0..self.hosts.len() {
            for _ in 0..self.hosts[h].qd {
                self.issue(h);
            }
        }
        for p in 0..self.steps.len() {
            if let Some((t, _)) = self.steps[p] {
                self.at(t, Ev::Rate(p as u32));
            }
        }
        let warm = self.sc.warmup_ms * 1_000_000;
        let end = warm + self.sc.duration_ms * 1_000_000;
        let mut next_trace = 0;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t > end {
                break;
            }
            if !self.measuring && t >= warm {
                self.measuring = true;
                self.bufs_gauge.update(t, self.in_use());
                self.bufs_gauge.reset(t);
            }
            self.now = t;
            self.handle(ev);
            if self.sc.trace && t >= next_trace {
                next_trace += 1_000_000;
                self.trace_line(t);
            }
        }
        self.now = end;
    }
}
