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
use server::engine::{IoToken, Part, Timeouts};

use super::clock::Clock;
use super::drive::Drive;
use super::ios::Ios;
use super::net::Net;
use super::Ev;
use crate::hosts::Host;
use crate::socket::Shut;

/// An IO outstanding this long on a connection that is up is hung: ten
/// times the longest stall, pause or flap a plan injects.
pub const HANG_NS: Nanos = 2_000_000_000;
/// How often outstanding IOs are looked over.
pub(super) const SCAN_NS: Nanos = 1_000_000;

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

/// The fault state of a run: what it injects next, and what it found.
pub(super) struct Faults {
    plan: FaultPlan,
    rng: SmallRng,
    counts: FaultCounts,
    /// Faults are over: no new IOs, faults or connections.
    winding: bool,
    /// IOs each host owes its queue depth, waiting for a connection.
    parked: Vec<u32>,
    draining: Vec<bool>,
    /// The first broken book or hung IO: the run stops at it.
    failure: Option<String>,
}

/// NBD errors a failed device IO returns.
const ERRNOS: [u32; 3] = [proto::EIO, proto::ENOSPC, proto::EPERM];

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

    /// How long faults go on.
    pub fn run_for(&self) -> Nanos {
        self.plan.run_for
    }

    /// Faults are over: no new IOs, faults or connections.
    pub fn wind_down(&mut self) {
        self.winding = true;
    }

    /// The first broken book or hung IO, if any.
    pub fn failure(&self) -> Option<&String> {
        self.failure.as_ref()
    }

    /// A check failed at `now` (only the first counts: the run stops).
    pub fn fail(&mut self, now: Nanos, what: String) {
        if self.failure.is_none() {
            self.failure = Some(format!("at {:.3} ms: {what}", now as f64 / 1e6));
        }
    }

    /// What the run injected and found; `done`: the IOs answered.
    pub fn counts(&mut self, done: u64) -> (FaultCounts, Option<String>) {
        self.counts.ios_done = done;
        (self.counts.clone(), self.failure.clone())
    }

    /// Whether host `host` may send an IO on a socket that is `deaf` or
    /// not; if not, the IO waits for a new connection (or the run's end).
    pub fn may_issue(&mut self, host: usize, deaf: bool) -> bool {
        if self.winding {
            return false;
        }
        if deaf {
            self.parked[host] += 1;
        }
        !deaf
    }

    /// A device IO's fault, if any: its NBD error (0: none) and the stall
    /// added to its completion.
    pub fn device_fault(&mut self, io: IoToken) -> (u32, Nanos) {
        if self.winding {
            return (0, 0);
        }
        let piece = matches!(io.part, Part::Piece(_));
        let mut errno = 0;
        if self.rng.gen_bool(self.plan.device_error) {
            errno = ERRNOS[self.rng.gen_range(0..ERRNOS.len())];
            match piece {
                true => self.counts.piece_errors += 1,
                false => self.counts.device_errors += 1,
            }
        }
        let mut stall = 0;
        if self.rng.gen_bool(self.plan.device_stall) {
            stall = self.rng.gen_range(1..=self.plan.stall_max);
            match piece {
                true => self.counts.piece_stalls += 1,
                false => self.counts.stalls += 1,
            }
        }
        (errno, stall)
    }

    /// The engine shut socket `s`'s connection down (both ways, or only
    /// reading: a drain).
    pub fn shut(
        &mut self,
        s: usize,
        read_only: bool,
        net: &mut Net,
        ios: &mut Ios,
        clock: &mut Clock,
    ) {
        let fate = &mut net.sock_mut(s).fate;
        let engine_ended = !fate.reset && fate.shut.is_none();
        if !read_only || fate.shut.is_none() {
            fate.shut = Some(if read_only { Shut::Read } else { Shut::Both });
        }
        let down = fate.down();
        if engine_ended {
            self.counts.engine_closes += 1;
        }
        if down {
            self.lose(s, net, ios);
        }
        fail_later(s, clock);
    }

    /// The engine closed socket `s`'s connection: its host reconnects.
    pub fn closed(
        &mut self,
        s: usize,
        net: &mut Net,
        ios: &mut Ios,
        hosts: &[Host],
        clock: &mut Clock,
    ) {
        net.sock_mut(s).fate.closed = true;
        self.lose(s, net, ios);
        let host = net.sock(s).host;
        let Some(k) = hosts[host].devices.iter().position(|d| d.1 == s) else {
            return;
        };
        if !self.winding {
            let after = self.rng.gen_range(1_000..=1_000_000);
            let ev = FaultEv::Reconnect(host as u32, k as u32);
            clock.at(clock.now() + after, Ev::Fault(ev));
        }
    }

    /// Socket `s` is down: its host's IOs on it are lost, and wait to be
    /// sent again on a new connection.
    fn lose(&mut self, s: usize, net: &Net, ios: &mut Ios) {
        let lost = ios.lose(s);
        self.counts.ios_lost += lost;
        self.parked[net.sock(s).host] += lost as u32;
    }

    /// Schedules the next timed fault of `kind`, a random gap after now
    /// (mean: the plan's).
    pub fn next_timed(&mut self, kind: Timed, clock: &mut Clock) {
        let mean = self.plan.gaps[kind as usize];
        if mean == 0 || self.winding {
            return;
        }
        let gap = self.rng.gen_range(1..=2 * mean);
        clock.at(clock.now() + gap, Ev::Fault(FaultEv::Next(kind)));
    }

    /// A timed fault of `kind` is due: false if faults are over; else the
    /// next one is scheduled.
    pub fn timed(&mut self, kind: Timed, clock: &mut Clock) -> bool {
        if self.winding {
            return false;
        }
        self.next_timed(kind, clock);
        true
    }

    /// A connection that is up, at random.
    pub fn pick_sock(&mut self, net: &Net) -> Option<usize> {
        let up = net.up();
        if up.is_empty() {
            return None;
        }
        Some(up[self.rng.gen_range(0..up.len())])
    }

    /// The host resets connection `s`.
    pub fn reset(&mut self, s: usize, net: &mut Net, ios: &mut Ios, clock: &mut Clock) {
        if net.sock(s).fate.down() {
            return;
        }
        let mid_payload = net.sock(s).mid_payload();
        let mid_request = ios.busy(s);
        let c = &mut self.counts;
        match (mid_payload, mid_request) {
            (true, _) => c.resets_mid_payload += 1,
            (false, true) => c.resets_mid_request += 1,
            (false, false) => c.resets_idle += 1,
        }
        let sock = net.sock_mut(s);
        sock.fate.reset = true;
        sock.paused = false;
        sock.held.clear();
        self.lose(s, net, ios);
        fail_later(s, clock);
    }

    /// A host stops reading one connection for a while; now and then it
    /// never reads again and resets it.
    pub fn pause(&mut self, net: &mut Net, clock: &mut Clock) {
        let Some(s) = self.pick_sock(net) else { return };
        if net.sock(s).paused {
            return;
        }
        net.sock_mut(s).paused = true;
        let d = self.rng.gen_range(1..=self.plan.pause_max);
        self.counts.pauses += 1;
        let ev = match self.rng.gen_bool(0.2) {
            true => {
                self.counts.pauses_then_reset += 1;
                FaultEv::Reset(s as u32)
            }
            false => FaultEv::Resume(s as u32),
        };
        clock.at(clock.now() + d, Ev::Fault(ev));
    }

    /// A host's link goes down for a while, both ways.
    pub fn flap(&mut self, hosts: &mut [Host], net: &mut Net, speed: f64, clock: &mut Clock) {
        if hosts.is_empty() {
            return;
        }
        let h = self.rng.gen_range(0..hosts.len());
        let until = clock.now() + self.rng.gen_range(1..=self.plan.flap_max);
        self.counts.flaps += 1;
        let host = &mut hosts[h];
        host.down_until = host.down_until.max(until);
        net.hold(h, until, speed, clock);
    }

    /// The pacing mode every reactor's pacer switches to, if any.
    pub fn pick_pacing(&mut self) -> Option<PacingConfig> {
        if self.plan.modes.is_empty() {
            return None;
        }
        let cfg = self.plan.modes[self.rng.gen_range(0..self.plan.modes.len())].clone();
        self.counts.pacing_changes += 1;
        Some(cfg)
    }

    /// The reactor that drains (as at shutdown), if another still serves.
    pub fn pick_drain(&mut self) -> Option<usize> {
        let open: Vec<usize> = (0..self.draining.len())
            .filter(|&r| !self.draining[r])
            .collect();
        if open.len() < 2 {
            return None;
        }
        let r = open[self.rng.gen_range(0..open.len())];
        self.draining[r] = true;
        self.counts.drains += 1;
        Some(r)
    }

    /// The reactor a host whose connection was on `from` reconnects to:
    /// the next that is not draining (none once faults are over).
    pub fn reconnect_to(&mut self, from: usize) -> Option<usize> {
        if self.winding {
            return None;
        }
        let n = self.draining.len();
        let r = (0..n)
            .map(|i| (from + i) % n)
            .find(|&r| !self.draining[r])?;
        self.counts.reconnects += 1;
        Some(r)
    }

    /// The IOs host `h` owes its queue depth, now that it has a connection.
    pub fn owed(&mut self, h: usize) -> u32 {
        std::mem::take(&mut self.parked[h])
    }

    /// After every event: the books (`Drive::books`).
    pub fn after_event(&mut self, drive: &mut Drive, now: Nanos) {
        if self.failure.is_some() {
            return;
        }
        self.counts.events += 1;
        if let Err(e) = drive.books() {
            self.fail(now, e);
        }
    }

    /// No IO on a connection that is up has been outstanding past
    /// [`HANG_NS`].
    pub fn scan(&mut self, ios: &Ios, net: &Net, clock: &mut Clock) {
        let now = clock.now();
        if let Some((id, io)) = ios.find(|io| now - io.issued > HANG_NS) {
            let sock = net.sock(io.sock as usize);
            let what = format!(
                "IO {id} of host {} hung: outstanding since {:.3} ms on reactor {} ({:?}, paused {})",
                io.host,
                io.issued as f64 / 1e6,
                sock.reactor,
                sock.fate,
                sock.paused
            );
            self.fail(now, what);
            return;
        }
        if !self.winding {
            clock.at(now + SCAN_NS, Ev::Fault(FaultEv::Scan));
        }
    }
}

/// Socket `s` is down: the operations posted on it fail, as an event now.
pub(super) fn fail_later(s: usize, clock: &mut Clock) {
    clock.now_do(Ev::Fault(FaultEv::Fail(s as u32)));
}
