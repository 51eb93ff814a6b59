//! A fault run (`iopace sim --faults`) and its checks: the books after
//! every event (`Faults::after_event`), no IO outstanding past a bound
//! (`Faults::scan`), and at the end every connection closed and every
//! buffer, slot and pacer entry returned.

use pace::Nanos;
use serde::Serialize;
use server::engine::TraceQuery;

use super::faults::{FaultCounts, FaultEv, FaultPlan, Faults, SCAN_NS, TIMED};
use super::{Ev, Sim};
use crate::scenario::{RunConfig, Scenario};
use crate::socket::Sock;
use crate::target::{Limits, Target};

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

/// A run of a scenario with a plan's faults.
pub(crate) struct FaultRun<'a> {
    sim: Sim<'a>,
}

impl<'a> FaultRun<'a> {
    /// A run of `sc` at `qd` with `plan`'s faults.
    pub fn new(sc: &'a Scenario, run: &RunConfig, qd: u32, plan: FaultPlan) -> FaultRun<'a> {
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
        let faults = Faults::new(plan, sim.hosts.len(), sim.drive.engines().len());
        sim.faults = Some(Box::new(faults));
        FaultRun { sim }
    }

    fn faults(&mut self) -> &mut Faults {
        self.sim.faults.as_deref_mut().expect("a fault run")
    }

    fn failed(&self) -> bool {
        self.sim
            .faults
            .as_ref()
            .is_some_and(|f| f.failure().is_some())
    }

    fn fail(&mut self, what: String) {
        let now = self.sim.clock.now();
        self.faults().fail(now, what);
    }

    /// Runs the plan's faults, then winds down and checks that everything
    /// came back.
    pub fn run(mut self) -> FaultOutcome {
        self.sim.first_ios();
        let run_for = self.faults().run_for();
        for kind in TIMED {
            let clock = &mut self.sim.clock;
            let faults = self.sim.faults.as_deref_mut().expect("a fault run");
            faults.next_timed(kind, clock);
        }
        self.sim.clock.at(SCAN_NS, Ev::Fault(FaultEv::Scan));
        self.events_until(run_for);
        if !self.failed() {
            self.wind_down();
        }
        let done = self.sim.meter.completed();
        let sim_ms = self.sim.clock.now() as f64 / 1e6;
        let (counts, failure) = self.faults().counts(done);
        FaultOutcome {
            counts,
            failure,
            sim_ms,
        }
    }

    /// Handles events up to `end`, or until a check fails.
    fn events_until(&mut self, end: Nanos) {
        while !self.failed() {
            if !self.sim.next_event(end) {
                return;
            }
        }
    }

    /// Faults stop and hosts issue nothing more: what is in flight must
    /// be answered (or lost with its connection). Then the hosts hang up,
    /// and every connection must close with everything returned.
    fn wind_down(&mut self) {
        self.faults().wind_down();
        self.events_until(self.sim.clock.now() + WIND_NS);
        if self.failed() {
            return;
        }
        if let Some((id, io)) = self.sim.ios.find(|_| true) {
            let what = format!(
                "IO {id} of host {} hung: outstanding since {:.3} ms after faults stopped",
                io.host,
                io.issued as f64 / 1e6
            );
            self.fail(what);
            return;
        }
        self.sim.hang_up();
        self.events_until(self.sim.clock.now() + WIND_NS);
        if !self.failed() {
            let sim = &self.sim;
            let socks = sim.net.socks();
            if let Err(e) = all_returned(sim.drive.target(), socks, sim.clock.now()) {
                self.fail(e);
            }
        }
    }
}

/// Every connection closed; every buffer, request slot and pacer entry
/// returned.
fn all_returned(target: &Target, socks: &[Sock], now: Nanos) -> Result<(), String> {
    for (r, e) in target.engines.iter().enumerate() {
        let p = e.pacer();
        let left = [
            ("connections open", e.conns_open() as u64),
            ("requests", e.requests_in_use() as u64),
            ("buffers", e.buffers_in_use()),
            ("IOs queued in the pacer", p.queued() as u64),
            ("bytes in flight in the pacer", p.bytes_in_flight()),
        ];
        if let Some((what, n)) = left.iter().find(|(_, n)| *n > 0) {
            let open = socks.iter().find(|s| s.reactor == r && !s.fate.closed);
            let state = open.map(|s| (s.conn, s.fate, e.conn_state(s.conn)));
            let reqs: Vec<String> = e
                .trace(TraceQuery::Oldest(4), now)
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
    let pool = &target.pool;
    let (free, total) = (pool.free_total(), u64::from(pool.total()));
    if free != total {
        return Err(format!("pool: {free} of {total} buffers back at the end"));
    }
    Ok(())
}
