//! Deterministic discrete-event simulator running the target's own request
//! engine (`server::engine`: connections, requests, buffer pool, pacers) at
//! data-centre scale: simulated sockets, links and devices replace its IO.
//! [`world`] says what is simulated; a scenario file says at what scale
//! ([`scenario`]); [`report`] prints a sweep table per run (one row per QD).

mod chunk;
mod devices;
pub mod faults;
pub mod fuzz;
mod hosts;
pub mod jobs;
mod nvme_host;
pub mod oracle;
mod ports;
pub mod report;
pub mod scenario;
mod socket;
mod target;
mod validate;
mod world;

pub use report::{render, Row};
pub use scenario::{
    DeviceGroup, DeviceKind, HostGroup, PortModel, Protocol, RunConfig, Scenario, TargetModel,
};
pub use validate::{load, parse};

/// Runs one configuration at one QD.
pub fn simulate(sc: &Scenario, run: &RunConfig, qd: u32) -> Row {
    let mut sim = world::Sim::new(sc, run, qd);
    sim.run_events();
    sim.row(qd)
}

/// Every run of a scenario at every QD.
pub fn run_scenario(sc: &Scenario) -> Vec<(String, Vec<Row>)> {
    sc.runs
        .iter()
        .map(|r| {
            (
                r.label.clone(),
                sc.qds.iter().map(|&q| simulate(sc, r, q)).collect(),
            )
        })
        .collect()
}

/// How `iopace sim` prints its results.
#[derive(Debug, Clone, Copy, Default)]
pub struct Output {
    /// JSON instead of tables.
    pub json: bool,
    /// Each reactor's pacer state every simulated millisecond, to stderr.
    pub trace: bool,
}

/// `iopace sim SCENARIO.toml...`: runs each scenario and prints its
/// results; a scenario that does not load ends it with exit status 2.
pub fn run(paths: &[String], out: Output) -> i32 {
    for p in paths {
        let sc = match load(p) {
            Ok(s) => Scenario {
                trace: out.trace,
                ..s
            },
            Err(e) => {
                eprintln!("iopace sim: {e}");
                return 2;
            }
        };
        let results = run_scenario(&sc);
        if out.json {
            let v: Vec<_> = results
                .iter()
                .map(|(l, rows)| serde_json::json!({"scenario": sc.name, "run": l, "rows": rows}))
                .collect();
            println!("{}", serde_json::Value::Array(v));
        } else {
            print!("{}", render(&sc, &results));
            print!("{}", oracle::render(&sc, &results));
        }
    }
    0
}

#[cfg(test)]
mod nvme_tests;
#[cfg(test)]
mod tests;
