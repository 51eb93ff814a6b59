//! `iopace sim --faults SEED --count N`: small random targets ([`gen`]) run
//! under dense faults: device errors and stalls (whole IOs and pieces),
//! connections reset idle, mid-request and mid-payload, hosts that stop
//! reading, link flaps, pacing modes switched and reactors drained at
//! random times. After every event each engine's books must balance
//! (`Engine::audit`: buffers, commitments, pieces, requests, READ turns,
//! the pacer's queue and bytes), with the bytes it was told of and the
//! pool's count of buffers; no IO may stay outstanding past
//! [`HANG_NS`] on a connection that is up; and at the end every
//! connection closes with every buffer, slot and pacer entry returned.
//! The performance fuzzer (`--fuzz`) and its scores are untouched.

pub mod gen;

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::Serialize;

pub use crate::world::{FaultCounts, FaultOutcome, FaultPlan, HANG_NS};
use crate::{parse, world::FaultRun};

/// What `iopace sim --faults` was asked for.
pub type FaultArgs = crate::jobs::Cases;

/// One case's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    pub seed: u64,
    pub index: u64,
    pub pass: bool,
    /// What broke first, and when (simulated time).
    pub failure: Option<String>,
    pub counts: FaultCounts,
    pub sim_ms: f64,
    pub elapsed_ms: u64,
}

impl Case {
    /// The command that runs this case alone.
    pub fn repro(&self) -> String {
        format!("iopace sim --faults {} --index {}", self.seed, self.index)
    }
}

/// Runs case `index` of `seed`. A panic inside the engine or the pacer
/// (a release assert) is a failure like a broken book.
pub fn run_case(seed: u64, index: u64) -> Case {
    let started = std::time::Instant::now();
    let (text, plan) = gen::case(seed, index);
    let outcome = match parse(&text, &format!("faults-{seed}-{index}.toml")) {
        Ok(sc) => catch_unwind(AssertUnwindSafe(|| {
            FaultRun::new(&sc, &sc.runs[0], sc.qds[0], plan).run()
        }))
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            format!("panic: {}", msg.unwrap_or_default())
        }),
        Err(e) => Err(format!("a generated scenario did not load: {e}")),
    };
    let (counts, failure, sim_ms) = match outcome {
        Ok(o) => (o.counts, o.failure, o.sim_ms),
        Err(e) => (FaultCounts::default(), Some(e), 0.0),
    };
    Case {
        seed,
        index,
        pass: failure.is_none(),
        failure,
        counts,
        sim_ms,
        elapsed_ms: started.elapsed().as_millis() as u64,
    }
}

/// Runs every case on `jobs` threads, in index order in the result.
pub fn run_cases(args: &FaultArgs) -> Vec<Case> {
    args.run(run_case)
}

/// `iopace sim --faults`: prints the report (or JSON); exit status 1
/// when any case fails.
pub fn faults(args: &FaultArgs) -> i32 {
    let cases = run_cases(args);
    if args.json {
        match serde_json::to_string_pretty(&cases) {
            Ok(j) => println!("{j}"),
            Err(e) => eprintln!("iopace sim --faults: {e}"),
        }
    } else {
        print!("{}", report(&cases));
    }
    i32::from(cases.iter().any(|c| !c.pass))
}

/// One count of a case.
type Count = fn(&FaultCounts) -> u64;

/// The counts over every case, and each failure with its repro.
pub fn report(cases: &[Case]) -> String {
    let pass = cases.iter().filter(|c| c.pass).count();
    let sum = |f: Count| cases.iter().map(|c| f(&c.counts)).sum::<u64>();
    let mut s = format!(
        "faults: {} cases, {pass} pass; {} faults injected in {} events, {:.0} ms simulated\n\n\
         | fault | count |\n|---|---|\n",
        cases.len(),
        sum(FaultCounts::faults),
        sum(|c| c.events),
        cases.iter().map(|c| c.sim_ms).sum::<f64>(),
    );
    let rows: [(&str, Count); 16] = [
        ("device errors (whole IOs)", |c| c.device_errors),
        ("device errors (pieces)", |c| c.piece_errors),
        ("device stalls (whole IOs)", |c| c.stalls),
        ("device stalls (pieces)", |c| c.piece_stalls),
        ("resets, idle", |c| c.resets_idle),
        ("resets, mid-request", |c| c.resets_mid_request),
        ("resets, mid-payload", |c| c.resets_mid_payload),
        ("hosts that stop reading", |c| c.pauses),
        ("... and then reset", |c| c.pauses_then_reset),
        ("link flaps", |c| c.flaps),
        ("pacing mode switches", |c| c.pacing_changes),
        ("reactor drains", |c| c.drains),
        ("connections the engine shut", |c| c.engine_closes),
        ("reconnects", |c| c.reconnects),
        ("IOs answered", |c| c.ios_done),
        ("IOs lost with their connection", |c| c.ios_lost),
    ];
    for (name, f) in rows {
        s += &format!("| {name} | {} |\n", sum(f));
    }
    for c in cases.iter().filter(|c| !c.pass) {
        s += &format!(
            "\nFAIL {}:{}: {}\n  repro: {}\n",
            c.seed,
            c.index,
            c.failure.as_deref().unwrap_or(""),
            c.repro()
        );
    }
    s
}

#[cfg(test)]
mod tests;
