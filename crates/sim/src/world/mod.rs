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

//!
//! The parts: the clock and its events (`clock.rs`), the engines as driven
//! (`drive.rs`), the sockets and ports (`net.rs`), the hosts' outstanding
//! IOs (`ios.rs`), NVMe/TCP hosts' setup and queues (`nvme.rs`), faults
//! (`faults.rs`), a fault run and its checks (`checks.rs`), and what is
//! measured and reported (`report.rs`). `Sim` owns them and carries each
//! event from one to the next.

use bdev::{IoOp, IoResult};
use pace::pacer::IoKind;
use pace::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use server::engine::{Action, ConnId, Input, IoToken, Opening, Received, Sent, TlsOutcome};

mod checks;
mod clock;
mod drive;
mod faults;
mod ios;
mod net;
mod nvme;
mod report;

pub use checks::FaultOutcome;
pub(crate) use checks::FaultRun;
pub use faults::{FaultCounts, FaultPlan, HANG_NS};

use clock::Clock;
use drive::Drive;
use faults::{FaultEv, Faults, Timed};
use ios::{Io, Ios};
use net::{Net, Posted};
use nvme::HostSide;
use report::{Meter, View};

use crate::devices::Dev;
use crate::hosts::{self, Dial, Host};
use crate::nvme_host::{self as nh, SetupReply};
use crate::report::Row;
use crate::scenario::{Protocol, RunConfig, Scenario};
use crate::socket::Sock;
use crate::target::{Limits, Target};

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

pub(crate) struct Sim<'a> {
    sc: &'a Scenario,
    clock: Clock,
    /// The target's engines, as driven.
    drive: Drive,
    net: Net,
    ios: Ios,
    hosts: Vec<Host>,
    devs: Vec<Dev>,
    /// Draws the hosts' IOs.
    rng: SmallRng,
    meter: Meter,
    /// Faults injected, and the checks after each event (`--faults`).
    faults: Option<Box<Faults>>,
    /// What NVMe/TCP hosts found wrong in the target's PDUs (none).
    nvme_errors: Vec<String>,
    /// Hosts issue no new IOs (a test's wind-down).
    quiesce: bool,
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, run: &RunConfig, qd: u32) -> Sim<'a> {
        Sim::build(sc, run, qd, None)
    }

    fn build(sc: &'a Scenario, run: &RunConfig, qd: u32, limits: Option<Limits>) -> Sim<'a> {
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
        let mut sim = Sim {
            sc,
            clock: Clock::new(),
            drive: Drive::new(target, reactors),
            net: Net::new(sc, &hosts, reactors),
            ios: Ios::default(),
            hosts,
            devs,
            rng: SmallRng::seed_from_u64(sc.seed ^ u64::from(qd) << 20),
            meter: Meter::new(sc.hosts.len(), format!("run={:?} qd={qd}", run.label)),
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

    /// Bytes of the buffers held by requests now.
    pub fn in_use_bytes(&self) -> u64 {
        self.drive.in_use_bytes()
    }

    /// The ports' speed now ([`Net::speed`]).
    fn speed(&self) -> f64 {
        self.net.speed(self.in_use_bytes())
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
        let deaf = self.net.sock(sock).fate.deaf();
        if let Some(f) = self.faults.as_deref_mut() {
            if !f.may_issue(host, deaf) {
                return;
            }
        }
        let h = &self.hosts[host];
        // Reads-only hosts draw nothing more, so their runs stay as seeded.
        let read = h.read_pct >= 100 || self.rng.gen_range(0..100) < h.read_pct;
        let offset = u64::from(self.rng.gen::<u32>()) * 4096;
        let now = self.clock.now();
        let arrive = now.max(h.down_until) + h.rtt / 2;
        let id = self.ios.add(Io {
            host,
            read,
            bytes,
            issued: now,
            live: true,
            sock: sock as u32,
            offset,
            cid: 0,
        });
        self.meter.issued();
        if self.net.sock(sock).nvme.is_some() {
            self.host_side().send(id);
            return;
        }
        let header = hosts::request(read, u64::from(id), offset, bytes);
        let payload = if read { 0 } else { bytes };
        self.net.sock_mut(sock).send_in(arrive, header, payload);
        self.clock.at(arrive, Ev::Arrive(sock as u32));
    }

    /// What NVMe/TCP hosts' queues act on.
    fn host_side(&mut self) -> HostSide<'_> {
        HostSide {
            net: &mut self.net,
            ios: &mut self.ios,
            hosts: &self.hosts,
            clock: &mut self.clock,
        }
    }

    /// IO `id`'s reply reached its host: latency and bytes are counted,
    /// and the host issues its next IO.
    fn reply(&mut self, id: u32) {
        let Some(io) = self.ios.answered(id) else {
            return; // its connection died first (a fault)
        };
        if self.net.sock(io.sock as usize).nvme.is_some() {
            self.host_side().replied(io.sock as usize, io.cid);
        }
        let (now, warm) = (self.clock.now(), self.sc.warmup_ms * 1_000_000);
        (self.meter).answered(&mut self.hosts[io.host], io.bytes, io.issued, now, warm);
        if !self.quiesce {
            self.issue(io.host);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(s) => self.feed(s as usize),
            Ev::Crossed(s) => {
                if let Some((r, conn, got)) = self.net.crossed(s as usize) {
                    self.received(r, conn, got);
                }
            }
            Ev::DeviceDone(r, io, submitted, errno) => {
                self.device_done(r as usize, io, submitted, errno)
            }
            Ev::Tick(r) => {
                if self.drive.tick(r as usize, self.clock.now()) {
                    self.pump(r as usize);
                }
            }
            Ev::TxDone(s, link_done) => self.tx_done(s as usize, link_done),
            Ev::PortFree(dir, p) => {
                let speed = self.speed();
                self.net.port_free(dir, p as usize, speed, &mut self.clock);
            }
            Ev::PortWake(dir, p) => {
                let speed = self.speed();
                self.net.port_wake(dir, p as usize, speed, &mut self.clock);
            }
            Ev::Reply(id) => self.reply(id),
            Ev::R2t(s, cid, ttag, offset, len) => {
                self.host_side().r2t(s as usize, cid, ttag, offset, len)
            }
            Ev::Rate(p) => {
                if let Some(rate) = self.net.step(p as usize) {
                    self.drive.port_rate(p as usize, rate / 1e9);
                }
            }
            Ev::Fault(f) => self.fault_event(f),
        }
        self.settle();
        if let Some(f) = self.faults.as_deref_mut() {
            f.after_event(&mut self.drive, self.clock.now());
        }
    }

    /// A host's first IOs leave a nanosecond apart, so their headers
    /// reach the target one by one, in the order the host drew them,
    /// rather than as one burst per connection.
    fn first_ios(&mut self) {
        for h in 0..self.hosts.len() {
            for k in 0..self.hosts[h].qd {
                self.clock.set(Nanos::from(k));
                self.issue(h);
            }
        }
        self.clock.set(0);
    }

    /// Handles the next event due by `end`; false if there is none.
    fn next_event(&mut self, end: Nanos) -> bool {
        let Some((t, ev)) = self.clock.next_by(end) else {
            return false;
        };
        self.clock.set(t);
        self.handle(ev);
        true
    }

    /// Runs the scenario's warm-up and measured stretch.
    pub fn run_events(&mut self) {
        self.first_ios();
        self.net.schedule_steps(&mut self.clock);
        let warm = self.sc.warmup_ms * 1_000_000;
        let end = warm + self.sc.duration_ms * 1_000_000;
        let mut next_trace = 0;
        // What is due after the end stays queued (a test's wind-down).
        while let Some((t, ev)) = self.clock.next_by(end) {
            if !self.meter.measuring() && t >= warm {
                self.meter.start(t, self.in_use_bytes());
            }
            self.clock.set(t);
            self.handle(ev);
            if self.sc.trace && t >= next_trace {
                next_trace += 1_000_000;
                self.meter.trace_line(t, self.drive.target());
            }
        }
        self.clock.set(end);
    }

    /// The row of the stretch just simulated.
    pub fn row(&self, qd: u32) -> Row {
        let view = View {
            sc: self.sc,
            hosts: &self.hosts,
            devs: &self.devs,
            target: self.drive.target(),
            live: self.ios.live(),
            end: self.clock.now(),
        };
        self.meter.row(qd, &view)
    }

    /// Carries out reactor `r`'s actions until it has none.
    fn pump(&mut self, r: usize) {
        self.drive.touch(r);
        loop {
            let mut actions = self.drive.actions(r);
            let done = actions.is_empty();
            for a in actions.drain(..) {
                self.apply(r, a);
            }
            self.drive.done_with(actions);
            if done {
                return;
            }
        }
    }

    fn apply(&mut self, r: usize, action: Action) {
        let now = self.clock.now();
        match action {
            Action::Recv { conn, buf, len } => {
                let s = self.net.of(r, conn);
                match self.net.post_recv(s, buf, len) {
                    true => self.feed(s),
                    false => faults::fail_later(s, &mut self.clock),
                }
            }
            Action::Send { conn, msg } => {
                let (s, speed) = (self.net.of(r, conn), self.speed());
                match (self.net).post_send(s, msg, &self.ios, speed, &mut self.clock) {
                    Posted::Now(n) => self.sent(r, conn, Sent::Bytes(n)),
                    Posted::Down => faults::fail_later(s, &mut self.clock),
                    Posted::Queued => {}
                }
            }
            // The simulated hosts never ask for STARTTLS.
            Action::StartTls { conn } => {
                debug_assert!(false, "reactor {r}: STARTTLS on {conn:?}");
                self.drive.engine(r).on_tls(now, conn, TlsOutcome::Failed);
            }
            Action::Submit { io, export, req } => {
                let device = self.drive.target().device(export);
                let kind = match req.op {
                    IoOp::Read => IoKind::Read,
                    _ => IoKind::Write,
                };
                let done = self.devs[device].start(now, kind, req.len);
                let fault = self.faults.as_deref_mut().map(|f| f.device_fault(io));
                let (errno, stall) = fault.unwrap_or((0, 0));
                self.clock
                    .at(done + stall, Ev::DeviceDone(r as u32, io, now, errno));
            }
            // Hosts never hang up and nothing times out within a run
            // without faults.
            Action::Shutdown { conn, read_only } => {
                let s = self.net.of(r, conn);
                let Some(f) = self.faults.as_deref_mut() else {
                    debug_assert!(false, "reactor {r} shuts {conn:?}");
                    return;
                };
                f.shut(s, read_only, &mut self.net, &mut self.ios, &mut self.clock);
            }
            Action::Close { conn } => {
                let s = self.net.of(r, conn);
                let Some(f) = self.faults.as_deref_mut() else {
                    debug_assert!(false, "reactor {r} closes {conn:?}");
                    return;
                };
                let (net, ios, clock) = (&mut self.net, &mut self.ios, &mut self.clock);
                f.closed(s, net, ios, &self.hosts, clock);
            }
        }
    }

    /// Tells reactor `r`'s engine of bytes received on `conn`.
    fn received(&mut self, r: usize, conn: ConnId, result: Received) {
        self.drive.received(r, conn, result, self.clock.now());
        self.pump(r);
    }

    /// Tells reactor `r`'s engine its send on `conn` finished.
    fn sent(&mut self, r: usize, conn: ConnId, result: Sent) {
        self.drive.sent(r, conn, result, self.clock.now());
    }

    /// Hands socket `s`'s arrived bytes to its posted recv.
    fn feed(&mut self, s: usize) {
        let speed = self.speed();
        if let Some((r, conn, got)) = self.net.feed(s, speed, &mut self.clock) {
            self.received(r, conn, got);
        }
    }

    /// The port carried socket `s`'s oldest chunk: the engine's send
    /// reports it, and a reply's last chunk crosses back to the host.
    fn tx_done(&mut self, s: usize, link_done: Nanos) {
        let Some((chunk, sent)) = self.net.carried(s) else {
            return; // its send failed meanwhile
        };
        if let Some(c) = chunk {
            let at = link_done + self.hosts[self.net.sock(s).host].rtt / 2;
            match c.nvme {
                Some(mark) => {
                    if let Err(e) = self.host_side().mark(s, c.cookie as u16, mark, at) {
                        self.nvme_wrong(s, e);
                    }
                }
                None if c.last => self.clock.at(at, Ev::Reply(c.cookie as u32)),
                None => {}
            }
        }
        if let Some(n) = sent {
            let (r, conn) = (self.net.sock(s).reactor, self.net.sock(s).conn);
            self.sent(r, conn, Sent::Bytes(n));
            self.pump(r);
        }
    }

    fn device_done(&mut self, r: usize, io: IoToken, submitted: Nanos, errno: u32) {
        let now = self.clock.now();
        self.meter.device(now - submitted);
        let result = match errno {
            0 => IoResult::Ok,
            e => IoResult::Err(e),
        };
        self.drive.engine(r).on_io_done(now, io, result);
        self.pump(r);
    }

    /// After an event: reactors the pool woke run at once, each touched
    /// reactor's next tick is due when its engine asks, and the buffer
    /// gauge moves.
    fn settle(&mut self) {
        let now = self.clock.now();
        loop {
            let mut any = false;
            for r in 0..self.drive.engines().len() {
                if self.drive.wake(r, now) {
                    self.pump(r);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        self.drive.schedule_ticks(&mut self.clock);
        self.meter.gauge(now, self.in_use_bytes());
    }

    /// Opens a host's connection: the target accepts it and the handshake
    /// runs to its end at once (its round trips are not simulated).
    /// Returns its socket.
    fn connect(&mut self, dial: Dial) -> usize {
        let (r, h) = (dial.reactor, dial.host);
        if self.hosts[h].protocol == Protocol::NvmeTcp {
            let subnqn = (self.drive.target())
                .nqn(dial.device, self.hosts[h].tenant)
                .to_string();
            let (s, q) = nvme::connect(self, r, h, &subnqn);
            self.net.nvme_ready(s, q);
            return s;
        }
        let export = self
            .drive
            .target()
            .export(dial.device, self.hosts[h].tenant);
        let now = self.clock.now();
        let Some(conn) = self.drive.engine(r).accept(now, None) else {
            debug_assert!(false, "a new engine is not draining");
            return usize::MAX;
        };
        self.set_peer(r, conn, h);
        let mut sock = Sock::new(r, conn, h);
        sock.send_in(now, hosts::handshake(&export), 0);
        let s = self.net.add(sock);
        self.pump(r);
        let state = self.drive.engine(r).conn_state(conn).map(|c| c.0);
        debug_assert_eq!(state, Some(Input::Headers), "{export}: handshake failed");
        self.net.sock_mut(s).negotiated = true;
        s
    }

    /// Names reactor `r`'s new connection `conn`, host `h`'s next socket.
    /// Each host has an address of its own: the target's pacer pools the
    /// windows of one host's connections, as it does for a real peer.
    fn set_peer(&mut self, r: usize, conn: ConnId, h: usize) {
        let s = self.net.next();
        let peer = format!("10.{}.{}.1:{}", h / 256, h % 256, 40_000 + s % 20_000);
        let port = Some(self.hosts[h].port);
        self.drive.engine(r).set_peer(conn, &peer, port);
    }

    /// The target sent socket `s`'s host something it did not expect.
    fn nvme_wrong(&mut self, s: usize, what: String) {
        debug_assert!(false, "socket {s}: {what}");
        self.nvme_errors.push(format!("socket {s}: {what}"));
    }

    fn fault_event(&mut self, ev: FaultEv) {
        let speed = self.speed();
        let (net, ios, clock) = (&mut self.net, &mut self.ios, &mut self.clock);
        match (ev, self.faults.as_deref_mut()) {
            (FaultEv::Next(kind), _) => self.timed_fault(kind),
            (FaultEv::Fail(s), _) => self.fail_ops(s as usize),
            (FaultEv::Resume(s), _) => net.resume(s as usize, speed, clock),
            (FaultEv::Reset(s), Some(f)) => f.reset(s as usize, net, ios, clock),
            (FaultEv::Reconnect(h, k), _) => self.reconnect(h as usize, k as usize),
            (FaultEv::Scan, Some(f)) => f.scan(ios, net, clock),
            (FaultEv::Reset(_) | FaultEv::Scan, None) => {}
        }
    }

    /// Fails what is posted on a socket that is down: a recv reads an
    /// error (a reset) or the end (a shutdown), a send fails.
    fn fail_ops(&mut self, s: usize) {
        let sock = self.net.sock_mut(s);
        if sock.fate.closed {
            return;
        }
        let (r, conn, fate) = (sock.reactor, sock.conn, sock.fate);
        if fate.deaf() && sock.cancel_recv() {
            let result = match fate.reset {
                true => Received::Error(libc::ECONNRESET),
                false => Received::Eof,
            };
            self.received(r, conn, result);
        }
        let sock = self.net.sock_mut(s);
        if sock.fate.down() && sock.cancel_send() {
            self.sent(r, conn, Sent::Error(libc::EPIPE));
            self.pump(r);
        }
    }

    /// A timed fault of `kind`, and the next one scheduled.
    fn timed_fault(&mut self, kind: Timed) {
        let (speed, now) = (self.speed(), self.clock.now());
        let Some(f) = self.faults.as_deref_mut() else {
            return;
        };
        if !f.timed(kind, &mut self.clock) {
            return;
        }
        let (net, ios, clock) = (&mut self.net, &mut self.ios, &mut self.clock);
        match kind {
            Timed::Reset => {
                if let Some(s) = f.pick_sock(net) {
                    f.reset(s, net, ios, clock);
                }
            }
            Timed::Pause => f.pause(net, clock),
            Timed::Flap => f.flap(&mut self.hosts, net, speed, clock),
            Timed::Pacing => {
                let Some(cfg) = f.pick_pacing() else { return };
                for r in 0..self.drive.engines().len() {
                    self.drive.engine(r).set_pacing(cfg.clone(), now);
                    self.pump(r);
                }
            }
            Timed::Drain => {
                let Some(r) = f.pick_drain() else { return };
                self.drive.engine(r).begin_drain(now);
                self.pump(r);
            }
        }
    }

    /// Host `h` opens its `k`th connection again, on a reactor that is not
    /// draining, and sends the IOs it owes.
    fn reconnect(&mut self, h: usize, k: usize) {
        let (device, old) = self.hosts[h].devices[k];
        let from = self.net.sock(old).reactor;
        let to = self
            .faults
            .as_deref_mut()
            .and_then(|f| f.reconnect_to(from));
        let Some(reactor) = to else {
            return;
        };
        let s = self.connect(Dial {
            host: h,
            device,
            reactor,
        });
        self.hosts[h].devices[k].1 = s;
        let owed = self.faults.as_deref_mut().map_or(0, |f| f.owed(h));
        for _ in 0..owed {
            self.issue(h);
        }
    }

    /// The hosts hang up every connection still up (a fault run's end).
    fn hang_up(&mut self) {
        let now = self.clock.now();
        for s in 0..self.net.socks().len() {
            if !self.net.sock(s).fate.deaf() {
                self.net.sock_mut(s).send_eof(now);
                self.feed(s);
            }
        }
        self.settle();
        if let Some(f) = self.faults.as_deref_mut() {
            f.after_event(&mut self.drive, now);
        }
    }
}

/// An NVMe/TCP host's setup: connections open and bytes go and come back
/// at once.
impl nvme::Setup for Sim<'_> {
    fn open(&mut self, r: usize, h: usize) -> usize {
        let Some(conn) = self.drive.engine(r).open(self.clock.now(), Opening::Nvme) else {
            panic!("reactor {r}: a new engine is not draining");
        };
        self.set_peer(r, conn, h);
        let mut sock = Sock::new(r, conn, h);
        sock.setup_rx = Some(Vec::new());
        let s = self.net.add(sock);
        self.pump(r);
        s
    }

    fn exchange(
        &mut self,
        s: usize,
        bytes: Vec<u8>,
        fresh: bool,
    ) -> Result<Vec<SetupReply>, String> {
        let now = self.clock.now();
        let sock = self.net.sock_mut(s);
        let r = sock.reactor;
        sock.setup_rx = Some(Vec::new());
        sock.send_in(now, bytes, 0);
        self.feed(s);
        self.pump(r);
        let got = self.net.sock_mut(s).setup_rx.take().unwrap_or_default();
        nh::setup_replies(&got, fresh)
    }
}

#[cfg(test)]
mod sim_tests;
