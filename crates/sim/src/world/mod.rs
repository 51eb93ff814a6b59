//! The simulated data centre around the real target, advanced event by
//! event.
//!
//! The target is the server's own request engine (`server::engine`), one
//! per reactor, over the real buffer pool and pacers ([`crate::target`]).
//! Everything around it is simulated:
//!
//! - Hosts keep `qd` IOs outstanding each, to devices chosen at random,
//!   writing NBD request headers or NVMe/TCP capsules (and WRITE payloads)
//!   into their connections ([`crate::hosts`], [`crate::socket`],
//!   `nvme.rs`). A header reaches
//!   the target half an RTT after it is sent; a payload crosses the host's
//!   link and the port's ingress only into a recv the engine has posted.
//! - The engine's sends leave on the host's port, which shares its bytes
//!   fairly between hosts and lets each host's link hold that host to its
//!   rate ([`crate::ports`]), scaled down by a memory/DDIO factor when the
//!   bytes held in buffers exceed a cache budget. A reply reaches the host
//!   half an RTT after it crossed the host's link; the host reads its
//!   header and issues its next IO.
//! - The engine's device IOs go to simulated drives ([`crate::devices`])
//!   and complete at their simulated time.
//! - The engine is ticked when it asks to be (its pacer's timer) and when
//!   the pool wakes its reactor (grants, cache drains).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pace::stats::{LatencyHist, TimeAvg};
use pace::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use server::engine::{Action, IoToken};

mod checks;
mod drive;
mod faults;
mod nvme;
mod report;

pub use checks::{FaultOutcome, HANG_NS};
pub use faults::{FaultCounts, FaultPlan};

use crate::devices::Dev;
use crate::hosts::{self, Host};
use crate::ports::{Port, Start};
use crate::scenario::{RunConfig, Scenario};
use crate::socket::{Chunk, Sock};
use crate::target::Target;

/// Width of a slot of the BW STDDEV column.
pub(crate) const SLOT_NS: Nanos = 10_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Dir {
    /// Target to hosts: replies.
    Egress,
    /// Hosts to target: write payloads.
    Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Bytes a host sent reach the target on this socket.
    Arrive(u32),
    /// Payload bytes crossed into this socket's posted recv.
    Crossed(u32),
    /// A reactor's device IO, submitted at the given time, is done, with
    /// this NBD error (0: none).
    DeviceDone(u32, IoToken, Nanos, u32),
    /// A reactor's engine asked for a tick now.
    Tick(u32),
    /// The port carried a socket's oldest chunk of replies; it crossed the
    /// host's link at the given time.
    TxDone(u32, Nanos),
    PortFree(Dir, u32),
    PortWake(Dir, u32),
    /// IO `id`'s reply reached its host.
    Reply(u32),
    Rate(u32),
    /// An R2T reached its host: socket, command id, transfer tag, offset
    /// and length of the data asked for.
    R2t(u32, u16, u16, u32, u32),
    /// An injected fault, or what follows one (`iopace sim --faults`).
    Fault(faults::FaultEv),
}

/// An IO a host has outstanding; its index is the request's cookie.
#[derive(Debug, Clone, Default)]
pub(crate) struct Io {
    pub host: usize,
    read: bool,
    pub bytes: u32,
    pub issued: Nanos,
    pub live: bool,
    /// The socket it went on.
    sock: u32,
    /// Its byte offset, and on an NVMe/TCP queue its command id.
    offset: u64,
    cid: u16,
}

pub(crate) struct Sim<'a> {
    pub sc: &'a Scenario,
    pub now: Nanos,
    seq: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    pub target: Target,
    /// When each reactor's next tick is due.
    tick_at: Vec<Option<Nanos>>,
    /// Reactors an event touched: their next tick is recomputed.
    touched: Vec<bool>,
    actions: Vec<Action>,
    chunks: Vec<Chunk>,
    pub ios: Vec<Io>,
    free_ios: Vec<u32>,
    pub hosts: Vec<Host>,
    socks: Vec<Sock>,
    /// Per reactor, the socket of each connection slot.
    sock_of: Vec<Vec<u32>>,
    pub devs: Vec<Dev>,
    egress: Vec<Port>,
    ingress: Vec<Port>,
    steps: Vec<Option<(Nanos, f64)>>,
    pub bufs_gauge: TimeAvg,
    rng: SmallRng,
    pub lat: LatencyHist,
    pub group_lat: Vec<LatencyHist>,
    pub device_lat: LatencyHist,
    pub measuring: bool,
    pub issued: u64,
    pub completed: u64,
    /// Names the run in `--trace` lines.
    pub trace_tag: String,
    /// Bytes each reactor's engine was told it received and sent.
    moved: Vec<(u64, u64)>,
    /// Reactors whose engine ran since their books were last audited.
    unaudited: Vec<bool>,
    /// Faults injected, and the checks after each event (`--faults`).
    faults: Option<Box<faults::Faults>>,
    /// What NVMe/TCP hosts found wrong in the target's PDUs (none).
    pub nvme_errors: Vec<String>,
    /// Hosts issue no new IOs (a test's wind-down).
    pub quiesce: bool,
}

/// One direction of every target port, each host a flow on its own.
fn ports(sc: &Scenario, hosts: &[Host]) -> Vec<Port> {
    let mut ports: Vec<Port> = sc
        .ports
        .iter()
        .map(|p| Port::new(p.rate_gbps * 1e9))
        .collect();
    for (i, h) in hosts.iter().enumerate() {
        ports[h.port].add_flow(i, sc.hosts[h.group].link_gbps.map(|r| r * 1e9));
    }
    ports
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, run: &RunConfig, qd: u32) -> Sim<'a> {
        Sim::build(sc, run, qd, None)
    }

    fn build(
        sc: &'a Scenario,
        run: &RunConfig,
        qd: u32,
        limits: Option<crate::target::Limits>,
    ) -> Sim<'a> {
        let mut devs = Dev::all(&sc.devices);
        let warm = sc.warmup_ms * 1_000_000;
        for d in &mut devs {
            d.measure(warm, warm + sc.duration_ms * 1_000_000);
        }
        let (hosts, dials) = hosts::hosts(sc, run, qd, devs.len());
        let reactors = run.reactors.unwrap_or(sc.target.reactors);
        let mut slots = vec![0u32; reactors];
        for d in &dials {
            slots[d.reactor] += hosts[d.host].qd;
        }
        let most = slots.into_iter().max().unwrap_or(0);
        let target = Target::new(sc, run, &devs, most, limits);
        let (egress, ingress) = (ports(sc, &hosts), ports(sc, &hosts));
        let mut sim = Sim {
            sc,
            trace_tag: format!("run={:?} qd={qd}", run.label),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            target,
            tick_at: vec![None; reactors],
            touched: vec![false; reactors],
            actions: Vec::new(),
            chunks: Vec::new(),
            ios: Vec::new(),
            free_ios: Vec::new(),
            hosts,
            socks: Vec::new(),
            sock_of: vec![Vec::new(); reactors],
            devs,
            egress,
            ingress,
            steps: sc
                .ports
                .iter()
                .map(|p| p.step.map(|(ms, g)| (ms * 1_000_000, g * 1e9)))
                .collect(),
            bufs_gauge: TimeAvg::new(0),
            rng: SmallRng::seed_from_u64(sc.seed ^ u64::from(qd) << 20),
            lat: LatencyHist::new(),
            group_lat: sc.hosts.iter().map(|_| LatencyHist::new()).collect(),
            device_lat: LatencyHist::new(),
            measuring: false,
            issued: 0,
            completed: 0,
            moved: vec![(0, 0); reactors],
            unaudited: vec![false; reactors],
            faults: None,
            nvme_errors: Vec::new(),
            quiesce: false,
        };
        // A host's devices name their dials; each becomes the socket its
        // IOs go on (an NVMe/TCP host's admin queues have sockets too).
        for (k, d) in dials.into_iter().enumerate() {
            let host = d.host;
            let s = sim.connect(d);
            for dev in sim.hosts[host].devices.iter_mut().filter(|dev| dev.1 == k) {
                dev.1 = s;
            }
        }
        sim
    }

    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// Bytes of the buffers held by requests now.
    pub fn in_use_bytes(&self) -> u64 {
        self.target.buffer_bytes_in_use()
    }

    /// A host's next IO: its size, device and direction drawn at random;
    /// its header goes into the device's connection.
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
        let (_, sock) = h.devices[self.rng.gen_range(0..h.devices.len())];
        if self.faults.is_some() && !self.may_issue(host, sock) {
            return;
        }
        let h = &self.hosts[host];
        // Reads-only hosts draw nothing more, so their runs stay as seeded.
        let read = h.read_pct >= 100 || self.rng.gen_range(0..100) < h.read_pct;
        let offset = u64::from(self.rng.gen::<u32>()) * 4096;
        let arrive = self.now.max(h.down_until) + h.rtt / 2;
        let io = Io {
            host,
            read,
            bytes,
            issued: self.now,
            live: true,
            sock: sock as u32,
            offset,
            cid: 0,
        };
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
        if self.socks[sock].nvme.is_some() {
            self.nvme_send(id);
            return;
        }
        let header = hosts::request(read, u64::from(id), offset, bytes);
        let payload = if read { 0 } else { bytes };
        self.socks[sock].send_in(arrive, header, payload);
        self.at(arrive, Ev::Arrive(sock as u32));
    }

    fn ddio_factor(&self) -> f64 {
        let t = &self.sc.target;
        let mib = self.in_use_bytes() as f64 / (1u64 << 20) as f64;
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
                            self.at(seg.port_done, Ev::TxDone(token as u32, seg.link_done))
                        }
                        Dir::Ingress => self.at(seg.link_done, Ev::Crossed(token as u32)),
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

    /// IO `id`'s reply reached its host: latency and bytes are counted,
    /// and the host issues its next IO.
    fn reply(&mut self, id: u32) {
        if !self.ios[id as usize].live {
            return; // its connection died first (a fault)
        }
        let io = std::mem::take(&mut self.ios[id as usize]);
        debug_assert!(io.live);
        self.free_ios.push(id);
        if self.socks[io.sock as usize].nvme.is_some() {
            self.nvme_replied(io.sock as usize, io.cid);
        }
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
        if !self.quiesce {
            self.issue(io.host);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(s) => self.feed(s as usize),
            Ev::Crossed(s) => self.crossed(s as usize),
            Ev::DeviceDone(r, io, submitted, errno) => {
                self.device_done(r as usize, io, submitted, errno)
            }
            Ev::Tick(r) => self.tick(r as usize),
            Ev::TxDone(s, link_done) => self.tx_done(s as usize, link_done),
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
            Ev::R2t(s, cid, ttag, offset, len) => self.nvme_r2t(s as usize, cid, ttag, offset, len),
            Ev::Rate(p) => {
                if let Some((_, rate)) = self.steps[p as usize].take() {
                    self.egress[p as usize].set_rate(rate);
                    self.ingress[p as usize].set_rate(rate);
                    self.target.ports.set_capacity(p as usize, rate / 1e9);
                }
            }
            Ev::Fault(f) => self.fault_event(f),
        }
        self.settle();
        if self.faults.is_some() {
            self.after_event();
        }
    }

    /// Runs the scenario's warm-up and measured stretch.
    pub fn run_events(&mut self) {
        // A host's first IOs leave a nanosecond apart, so their headers
        // reach the target one by one, in the order the host drew them,
        // rather than as one burst per connection.
        for h in 0..self.hosts.len() {
            for k in 0..self.hosts[h].qd {
                self.now = Nanos::from(k);
                self.issue(h);
            }
        }
        self.now = 0;
        for p in 0..self.steps.len() {
            if let Some((t, _)) = self.steps[p] {
                self.at(t, Ev::Rate(p as u32));
            }
        }
        let warm = self.sc.warmup_ms * 1_000_000;
        let end = warm + self.sc.duration_ms * 1_000_000;
        let mut next_trace = 0;
        while let Some(Reverse((t, seq, ev))) = self.events.pop() {
            if t > end {
                // Kept for what may follow (a test's wind-down).
                self.events.push(Reverse((t, seq, ev)));
                break;
            }
            if !self.measuring && t >= warm {
                self.measuring = true;
                self.bufs_gauge.update(t, self.in_use_bytes());
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
