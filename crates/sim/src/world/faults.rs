//! Faults injected into a run (`iopace sim --faults`): device errors and
//! stalls (whole IOs and pieces), hosts that reset their connections (idle,
//! mid-request, mid-payload) or stop reading, host links that flap, pacing
//! modes switched and reactors drained at random times. What follows each
//! is the engine's: it closes connections, fails requests, drains; hosts
//! reconnect and keep their queue depth.
//!
//! After every event the books are audited ([`Sim::after_event`], in
//! `checks.rs`); a run ends with every IO answered or lost with its
//! connection, and every buffer back in the pool.

use pace::pacer::PacingConfig;
use pace::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use server::engine::{ConnId, IoToken, Part, Received, Sent, Timeouts};

use super::{Dir, Ev, Sim};
use crate::hosts::Dial;
use crate::socket::Shut;

/// What a case injects, and how often.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    pub seed: u64,
    /// Share of device IOs (whole or piece) that fail, and that stall.
    pub device_error: f64,
    pub device_stall: f64,
    /// Longest stall, pause and flap.
    pub stall_max: Nanos,
    pub pause_max: Nanos,
    pub flap_max: Nanos,
    /// Mean time between timed faults of each kind, in [`Timed`] order
    /// (resets, pauses, flaps, pacing changes, drains); 0: none.
    pub gaps: [Nanos; 5],
    /// The pacing configs switched among.
    pub modes: Vec<PacingConfig>,
    /// How long faults go on; then the run winds down.
    pub run_for: Nanos,
    pub timeouts: Timeouts,
    pub drain_timeout: Nanos,
    /// A delay layer in every device's bdev (see `Limits`), us; 0: none.
    pub engine_delay_us: u64,
}

/// The timed faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timed {
    Reset,
    Pause,
    Flap,
    Pacing,
    Drain,
}

pub const TIMED: [Timed; 5] = [
    Timed::Reset,
    Timed::Pause,
    Timed::Flap,
    Timed::Pacing,
    Timed::Drain,
];

/// What a fault set going, as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultEv {
    /// The next timed fault of a kind is due.
    Next(Timed),
    /// A socket that is down fails the operations posted on it.
    Fail(u32),
    /// A host that stopped reading reads again.
    Resume(u32),
    /// A host that stopped reading gives up: it resets its connection.
    Reset(u32),
    /// A host reconnects its `k`th connection.
    Reconnect(u32, u32),
    /// Time to look for IOs outstanding too long.
    Scan,
}

/// Faults injected, by kind, and what followed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultCounts {
    pub device_errors: u64,
    pub piece_errors: u64,
    pub stalls: u64,
    pub piece_stalls: u64,
    pub resets_idle: u64,
    pub resets_mid_request: u64,
    pub resets_mid_payload: u64,
    pub pauses: u64,
    pub pauses_then_reset: u64,
    pub flaps: u64,
    pub pacing_changes: u64,
    pub drains: u64,
    /// Connections the engine shut itself (timeouts, errors, drains).
    pub engine_closes: u64,
    pub reconnects: u64,
    pub ios_done: u64,
    /// IOs whose connection ended before their reply arrived.
    pub ios_lost: u64,
    /// Events the run handled, faults or not.
    pub events: u64,
}

impl FaultCounts {
    /// Faults injected.
    pub fn faults(&self) -> u64 {
        self.device_errors
            + self.piece_errors
            + self.stalls
            + self.piece_stalls
            + self.resets_idle
            + self.resets_mid_request
            + self.resets_mid_payload
            + self.pauses
            + self.flaps
            + self.pacing_changes
            + self.drains
    }
}

/// The fault state of a run.
pub(super) struct Faults {
    pub plan: FaultPlan,
    pub rng: SmallRng,
    pub counts: FaultCounts,
    /// Faults are over: no new IOs, faults or connections.
    pub winding: bool,
    /// IOs each host owes its queue depth, waiting for a connection.
    pub parked: Vec<u32>,
    pub draining: Vec<bool>,
    /// The first broken book or hung IO: the run stops at it.
    pub failure: Option<String>,
}

impl Faults {
    pub fn new(plan: FaultPlan, hosts: usize, reactors: usize) -> Faults {
        Faults {
            rng: SmallRng::seed_from_u64(plan.seed ^ 0xfa_017),
            plan,
            counts: FaultCounts::default(),
            winding: false,
            parked: vec![0; hosts],
            draining: vec![false; reactors],
            failure: None,
        }
    }
}

/// NBD errors a failed device IO returns.
const ERRNOS: [u32; 3] = [proto::EIO, proto::ENOSPC, proto::EPERM];

impl Sim<'_> {
    fn fault_state(&mut self) -> &mut Faults {
        self.faults.as_deref_mut().expect("a fault run")
    }

    /// Whether host `host` may send an IO on `sock` now; if not, the IO
    /// waits for a new connection (or the run's end).
    pub(super) fn may_issue(&mut self, host: usize, sock: usize) -> bool {
        let deaf = self.socks[sock].fate.deaf();
        let f = self.fault_state();
        if f.winding {
            return false;
        }
        if deaf {
            f.parked[host] += 1;
        }
        !deaf
    }

    /// A device IO's fault, if any: its NBD error (0: none) and the stall
    /// added to its completion.
    pub(super) fn device_fault(&mut self, io: IoToken) -> (u32, Nanos) {
        let Some(f) = self.faults.as_deref_mut() else {
            return (0, 0);
        };
        if f.winding {
            return (0, 0);
        }
        let piece = matches!(io.part, Part::Piece(_));
        let mut errno = 0;
        if f.rng.gen_bool(f.plan.device_error) {
            errno = ERRNOS[f.rng.gen_range(0..ERRNOS.len())];
            match piece {
                true => f.counts.piece_errors += 1,
                false => f.counts.device_errors += 1,
            }
        }
        let mut stall = 0;
        if f.rng.gen_bool(f.plan.device_stall) {
            stall = f.rng.gen_range(1..=f.plan.stall_max);
            match piece {
                true => f.counts.piece_stalls += 1,
                false => f.counts.stalls += 1,
            }
        }
        (errno, stall)
    }

    pub(super) fn fail_later(&mut self, s: usize) {
        self.at(self.now, Ev::Fault(FaultEv::Fail(s as u32)));
    }

    /// The engine shut `conn` down (both ways, or only reading: a drain).
    pub(super) fn shut(&mut self, r: usize, conn: ConnId, read_only: bool) {
        let s = self.sock(r, conn);
        let fate = &mut self.socks[s].fate;
        let engine_ended = !fate.reset && fate.shut.is_none();
        if !read_only || fate.shut.is_none() {
            fate.shut = Some(if read_only { Shut::Read } else { Shut::Both });
        }
        let down = fate.down();
        if engine_ended {
            self.fault_state().counts.engine_closes += 1;
        }
        if down {
            self.lose(s);
        }
        self.fail_later(s);
    }

    /// The engine closed `conn`: its host reconnects.
    pub(super) fn closed(&mut self, r: usize, conn: ConnId) {
        let s = self.sock(r, conn);
        self.socks[s].fate.closed = true;
        self.lose(s);
        let host = self.socks[s].host;
        let Some(k) = self.hosts[host].devices.iter().position(|d| d.1 == s) else {
            return;
        };
        let f = self.fault_state();
        if !f.winding {
            let after = f.rng.gen_range(1_000..=1_000_000);
            let ev = FaultEv::Reconnect(host as u32, k as u32);
            self.at(self.now + after, Ev::Fault(ev));
        }
    }

    /// Socket `s` is down: its host's IOs on it are lost, and wait to be
    /// sent again on a new connection.
    fn lose(&mut self, s: usize) {
        let mut lost = 0;
        for io in self
            .ios
            .iter_mut()
            .filter(|io| io.live && io.sock == s as u32)
        {
            io.live = false;
            lost += 1;
        }
        let host = self.socks[s].host;
        let f = self.fault_state();
        f.counts.ios_lost += lost;
        f.parked[host] += lost as u32;
    }

    pub(super) fn fault_event(&mut self, ev: FaultEv) {
        match ev {
            FaultEv::Next(kind) => self.timed_fault(kind),
            FaultEv::Fail(s) => self.fail_ops(s as usize),
            FaultEv::Resume(s) => self.resume(s as usize),
            FaultEv::Reset(s) => self.reset(s as usize),
            FaultEv::Reconnect(h, k) => self.reconnect(h as usize, k as usize),
            FaultEv::Scan => self.scan(),
        }
    }

    /// Fails what is posted on a socket that is down: a recv reads an
    /// error (a reset) or the end (a shutdown), a send fails.
    fn fail_ops(&mut self, s: usize) {
        let sock = &mut self.socks[s];
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
        let sock = &mut self.socks[s];
        if sock.fate.down() && sock.cancel_send() {
            self.sent(r, conn, Sent::Error(libc::EPIPE));
            self.pump(r);
        }
    }

    /// Schedules the next timed fault of `kind`, a random gap after now
    /// (mean: the plan's).
    pub(super) fn next_timed(&mut self, kind: Timed) {
        let now = self.now;
        let f = self.fault_state();
        let mean = f.plan.gaps[kind as usize];
        if mean == 0 || f.winding {
            return;
        }
        let gap = f.rng.gen_range(1..=2 * mean);
        self.at(now + gap, Ev::Fault(FaultEv::Next(kind)));
    }

    /// A timed fault of `kind`, and the next one scheduled.
    fn timed_fault(&mut self, kind: Timed) {
        if self.fault_state().winding {
            return;
        }
        self.next_timed(kind);
        match kind {
            Timed::Reset => {
                if let Some(s) = self.pick_sock() {
                    self.reset(s);
                }
            }
            Timed::Pause => self.pause(),
            Timed::Flap => self.flap(),
            Timed::Pacing => self.switch_pacing(),
            Timed::Drain => self.drain(),
        }
    }

    /// A connection that is up, at random.
    fn pick_sock(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.socks.len())
            .filter(|&s| !self.socks[s].fate.down() && self.socks[s].negotiated)
            .collect();
        if up.is_empty() {
            return None;
        }
        let f = self.fault_state();
        Some(up[f.rng.gen_range(0..up.len())])
    }

    /// The host resets connection `s`.
    fn reset(&mut self, s: usize) {
        if self.socks[s].fate.down() {
            return;
        }
        let mid_payload = self.socks[s].mid_payload();
        let mid_request = self.ios.iter().any(|io| io.live && io.sock == s as u32);
        let c = &mut self.fault_state().counts;
        match (mid_payload, mid_request) {
            (true, _) => c.resets_mid_payload += 1,
            (false, true) => c.resets_mid_request += 1,
            (false, false) => c.resets_idle += 1,
        }
        let sock = &mut self.socks[s];
        sock.fate.reset = true;
        sock.paused = false;
        sock.held.clear();
        self.lose(s);
        self.fail_later(s);
    }

    /// A host stops reading one connection for a while; now and then it
    /// never reads again and resets it.
    fn pause(&mut self) {
        let Some(s) = self.pick_sock() else { return };
        if self.socks[s].paused {
            return;
        }
        self.socks[s].paused = true;
        let f = self.fault_state();
        let d = f.rng.gen_range(1..=f.plan.pause_max);
        f.counts.pauses += 1;
        let ev = match f.rng.gen_bool(0.2) {
            true => {
                f.counts.pauses_then_reset += 1;
                FaultEv::Reset(s as u32)
            }
            false => FaultEv::Resume(s as u32),
        };
        self.at(self.now + d, Ev::Fault(ev));
    }

    fn resume(&mut self, s: usize) {
        let sock = &mut self.socks[s];
        if sock.fate.down() || !sock.paused {
            return;
        }
        sock.paused = false;
        let held = std::mem::take(&mut sock.held);
        let host = sock.host;
        let port = self.hosts[host].port;
        for c in held {
            self.egress[port].push(host, s as u64, c.bytes);
        }
        self.kick(Dir::Egress, port);
    }

    /// A host's link goes down for a while, both ways.
    fn flap(&mut self) {
        let (hosts, now) = (self.hosts.len(), self.now);
        if hosts == 0 {
            return;
        }
        let f = self.fault_state();
        let h = f.rng.gen_range(0..hosts);
        let until = now + f.rng.gen_range(1..=f.plan.flap_max);
        f.counts.flaps += 1;
        let host = &mut self.hosts[h];
        host.down_until = host.down_until.max(until);
        let port = host.port;
        self.egress[port].hold(h, until);
        self.ingress[port].hold(h, until);
        self.kick(Dir::Egress, port);
        self.kick(Dir::Ingress, port);
    }

    /// Every reactor's pacer switches to another mode (`set_pacing`).
    fn switch_pacing(&mut self) {
        let f = self.fault_state();
        if f.plan.modes.is_empty() {
            return;
        }
        let cfg = f.plan.modes[f.rng.gen_range(0..f.plan.modes.len())].clone();
        f.counts.pacing_changes += 1;
        for r in 0..self.target.engines.len() {
            self.target.engines[r].set_pacing(cfg.clone(), self.now);
            self.pump(r);
        }
    }

    /// One reactor drains (as at shutdown), while another still serves.
    fn drain(&mut self) {
        let f = self.fault_state();
        let open: Vec<usize> = (0..f.draining.len()).filter(|&r| !f.draining[r]).collect();
        if open.len() < 2 {
            return;
        }
        let r = open[f.rng.gen_range(0..open.len())];
        f.draining[r] = true;
        f.counts.drains += 1;
        self.target.engines[r].begin_drain(self.now);
        self.pump(r);
    }

    /// Host `h` opens its `k`th connection again, on a reactor that is not
    /// draining, and sends the IOs it owes.
    fn reconnect(&mut self, h: usize, k: usize) {
        let (device, old) = self.hosts[h].devices[k];
        let from = self.socks[old].reactor;
        let f = self.fault_state();
        if f.winding {
            return;
        }
        let n = f.draining.len();
        let Some(reactor) = (0..n).map(|i| (from + i) % n).find(|&r| !f.draining[r]) else {
            return;
        };
        f.counts.reconnects += 1;
        let s = self.connect(Dial {
            host: h,
            device,
            reactor,
        });
        self.hosts[h].devices[k].1 = s;
        let owed = std::mem::take(&mut self.fault_state().parked[h]);
        for _ in 0..owed {
            self.issue(h);
        }
    }
}
