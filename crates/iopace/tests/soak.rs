//! The 60-second soak (`scripts/soak.sh`) on the real binary: four fio
//! verify clients writing and reading back at random, killed mid-run at
//! random, pacing modes changing and SIGHUPs, with faults on (reads failing
//! with EIO, latency spikes, stalls). Its goals: 0 verify errors among the
//! IOs that did not fault, every buffer back, RSS flat after warm-up.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn a_60_second_soak_with_faults_meets_its_goals() {
    require("fio", "fio");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/soak.sh");
    let out = run(
        Command::new("sh").arg(script).arg(BIN).arg("60"),
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("goals met: yes"), "{text}");
    assert!(text.contains("failed (verify or IO errors) 0"), "{text}");
    let faulted = text
        .split("reads failed with EIO ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(faulted > Some(0), "faults were on: {text}");
}
