//! The 60-second soak (`scripts/soak.sh`) on the real binary: verify
//! clients writing and reading back at random, killed mid-run at random,
//! pacing modes changing and SIGHUPs, with faults on (reads failing with
//! EIO, latency spikes, stalls). Its goals: 0 verify errors among the IOs
//! that did not fault, every buffer back, RSS flat after warm-up. Over NBD
//! the clients are fio; over NVMe/TCP SPDK's bdevperf, when SPDK is built.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

/// Runs the soak for 60 s over `protocol`; its summary.
fn soak(protocol: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/soak.sh");
    let out = run(
        Command::new("sh").arg(script).args([BIN, "60", protocol]),
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("goals met: yes"), "{text}");
    assert!(text.contains("failed (verify or IO errors) 0"), "{text}");
    let faulted = text
        .split("reads failed with EIO ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(faulted > Some(0), "faults were on: {text}");
    text
}

#[test]
fn a_60_second_soak_with_faults_meets_its_goals() {
    require("fio", "fio");
    soak("nbd");
}

#[test]
fn a_60_second_soak_over_nvme_tcp_with_faults_meets_its_goals() {
    if nvme::spdk().is_none() {
        return;
    }
    let text = soak("nvme");
    let seen = text
        .split("status (00/06) seen by clients: ")
        .nth(1)
        .and_then(|t| t.lines().next())
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(seen > Some(0), "the clients saw the faults: {text}");
}
