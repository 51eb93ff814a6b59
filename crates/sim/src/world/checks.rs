//! A fault run's loop and its checks: the books after every event, no IO
//! outstanding past a bound, and at the end every connection closed and
//! every buffer, slot and pacer entry returned.

use std::cmp::Reverse;

use pace::Nanos;
use serde::Serialize;
use server::engine::TraceQuery;

use super::faults::{FaultCounts, FaultEv, FaultPlan, Faults, TIMED};
use super::{Ev, Sim};
use crate::scenario::{RunConfig, Scenario};
use crate::target::Limits;

/// An IO outstanding this long on a connection that is up is hung: ten
/// times the longest stall, pause or flap a plan injects.
pub const HANG_NS: Nanos = 2_000_000_000;
/// How often outstanding IOs are looked over.
const SCAN_NS: Nanos = 1_000_000;
/// Once faults stop, how long what is in flight has to finish, and then
/// how long the connections have to close once the hosts hang up.
const WIND_NS: Nanos = 5_000_000_000;

/// What a fault run found.
#[derive(Debug, Clone, Serialize)]
pub struct FaultOutcome {
    pub counts: FaultCounts,
    /// The first broken book, hung IO or leak, with its time.
    pub failure: Option<String>,
    /// Simulated time the run took, ms.
    pub sim_ms: f64,
}

impl<'a> Sim<'a> {
    /// A run of `sc` at `qd` with `plan`'s faults.
    pub fn with_faults(sc: &'a Scenario, run: &RunConfig, qd: u32, plan: FaultPlan) -> Sim<'a> {
        let limits = Limits {
            timeouts: plan.timeouts,
            drain_timeout: plan.drain_timeout,
            engine_delay_us: plan.engine_delay_us,
        };
        // Faults reconnect and close NBD connections only.
        debug_assert!(
            !sc.speaks_nvme(run),
            "{}: faults with NVMe/TCP hosts",
            sc.name
        );
        let mut sim = Sim::build(sc, run, qd, Some(limits));
        let faults = Faults::new(plan, sim.hosts.len(), sim.target.engines.len());
        sim.faults = Some(Box::new(faults));
        sim
    }

    fn failure(&self) -> Option<&String> {
        self.faults.as_ref().and_then(|f| f.failure.as_ref())
    }

    fn fail(&mut self, what: String) {
        let now = self.now;
        if let Some(f) = self.faults.as_deref_mut() {
            if f.failure.is_none() {
                f.failure = Some(format!("at {:.3} ms: {what}", now as f64 / 1e6));
            }
        }
    }

    /// Runs the plan's faults, then winds down and checks that everything
    /// came back.
    pub fn run_faults(&mut self) -> FaultOutcome {
        for h in 0..self.hosts.len() {
            for k in 0..self.hosts[h].qd {
                self.now = Nanos::from(k);
                self.issue(h);
            }
        }
        self.now = 0;
        let run_for = self.faults.as_deref().map_or(0, |f| f.plan.run_for);
        for kind in TIMED {
            self.next_timed(kind);
        }
        self.at(SCAN_NS, Ev::Fault(FaultEv::Scan));
        self.events_until(run_for);
        if self.failure().is_none() {
            self.wind_down();
        }
        let completed = self.completed;
        let now = self.now;
        let Some(f) = self.faults.as_deref_mut() else {
            unreachable!("a fault run has faults");
        };
        f.counts.ios_done = completed;
        FaultOutcome {
            counts: f.counts.clone(),
            failure: f.failure.clone(),
            sim_ms: now as f64 / 1e6,
        }
    }

    /// Handles events up to `end`, or until a check fails.
    fn events_until(&mut self, end: Nanos) {
        while self.failure().is_none() {
            match self.events.peek() {
                Some(Reverse((t, _, _))) if *t <= end => {}
                _ => return,
            }
            let Some(Reverse((t, _, ev))) = self.events.pop() else {
                return;
            };
            self.now = t;
            self.handle(ev);
        }
    }

    /// Faults stop and hosts issue nothing more: what is in flight must
    /// be answered (or lost with its connection). Then the hosts hang up,
    /// and every connection must close with everything returned.
    fn wind_down(&mut self) {
        if let Some(f) = self.faults.as_deref_mut() {
            f.winding = true;
        }
        self.events_until(self.now + WIND_NS);
        if self.failure().is_some() {
            return;
        }
        if let Some(id) = self.ios.iter().position(|io| io.live) {
            let io = &self.ios[id];
            let what = format!(
                "IO {id} of host {} hung: outstanding since {:.3} ms after faults stopped",
                io.host,
                io.issued as f64 / 1e6
            );
            self.fail(what);
            return;
        }
        for s in 0..self.socks.len() {
            if !self.socks[s].fate.deaf() {
                self.socks[s].send_eof(self.now);
                self.feed(s);
            }
        }
        self.settle();
        self.after_event();
        self.events_until(self.now + WIND_NS);
        if self.failure().is_none() {
            if let Err(e) = self.all_returned() {
                self.fail(e);
            }
        }
    }

    /// Every connection closed; every buffer, request slot and pacer
    /// entry returned.
    fn all_returned(&self) -> Result<(), String> {
        for (r, e) in self.target.engines.iter().enumerate() {
            let p = e.pacer();
            let left = [
                ("connections open", e.conns_open() as u64),
                ("requests", e.requests_in_use() as u64),
                ("buffers", e.buffers_in_use()),
                ("IOs queued in the pacer", p.queued() as u64),
                ("bytes in flight in the pacer", p.bytes_in_flight()),
            ];
            if let Some((what, n)) = left.iter().find(|(_, n)| *n > 0) {
                let open = self.socks.iter().find(|s| s.reactor == r && !s.fate.closed);
                let state = open.map(|s| (s.conn, s.fate, e.conn_state(s.conn)));
                let reqs: Vec<String> = e
                    .trace(TraceQuery::Oldest(4), self.now)
                    .iter()
                    .map(|t| {
                        let states: Vec<&str> = t.states.iter().map(|s| s.state.as_str()).collect();
                        format!("{} {} B: {}", t.command, t.len, states.join(">"))
                    })
                    .collect();
                return Err(format!(
                    "reactor {r}: {n} {what} at the end; {state:?}; {left:?}; oldest: {}",
                    reqs.join(" | ")
                ));
            }
        }
        let pool = &self.target.pool;
        let (free, total) = (pool.free_total(), u64::from(pool.total()));
        if free != total {
            return Err(format!("pool: {free} of {total} buffers back at the end"));
        }
        Ok(())
    }

    /// After every event: each engine's books ([`server::engine::Engine::audit`]),
    /// the bytes it was told of, and the pool's count of its buffers.
    pub(super) fn after_event(&mut self) {
        if self.failure().is_some() {
            return;
        }
        if let Some(f) = self.faults.as_deref_mut() {
            f.counts.events += 1;
        }
        if let Err(e) = self.books() {
            self.fail(e);
        }
    }

    /// The books of the engines that ran since the last audit, and the
    /// pool's.
    fn books(&mut self) -> Result<(), String> {
        let mut held = 0;
        for (r, e) in self.target.engines.iter().enumerate() {
            held += e.buffers_in_use();
            if !std::mem::take(&mut self.unaudited[r]) {
                continue;
            }
            e.audit().map_err(|b| format!("reactor {r}: books: {b}"))?;
            let (moved_in, moved_out) = e.bytes_moved();
            let (was_in, was_out) = self.moved[r];
            if (moved_in, moved_out) != (was_in, was_out) {
                return Err(format!(
                    "reactor {r}: bytes counted in/out {moved_in}/{moved_out}, moved {was_in}/{was_out}"
                ));
            }
        }
        let pool = &self.target.pool;
        let (free, total) = (pool.free_total(), u64::from(pool.total()));
        if held + free != total {
            return Err(format!(
                "pool: {held} buffers held + {free} free != {total}"
            ));
        }
        Ok(())
    }

    /// No IO on a connection that is up has been outstanding past
    /// [`HANG_NS`].
    pub(super) fn scan(&mut self) {
        let now = self.now;
        let hung = self
            .ios
            .iter()
            .position(|io| io.live && now - io.issued > HANG_NS);
        if let Some(id) = hung {
            let io = &self.ios[id];
            let sock = &self.socks[io.sock as usize];
            let what = format!(
                "IO {id} of host {} hung: outstanding since {:.3} ms on reactor {} ({:?}, paused {})",
                io.host,
                io.issued as f64 / 1e6,
                sock.reactor,
                sock.fate,
                sock.paused
            );
            self.fail(what);
            return;
        }
        if self.faults.as_deref().is_some_and(|f| !f.winding) {
            self.at(now + SCAN_NS, Ev::Fault(FaultEv::Scan));
        }
    }
}
