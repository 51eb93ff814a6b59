//! What each host carries alone: the scenario with only that host, under
//! `none`. A closed loop of QD IOs queues behind itself (two of its
//! replies meet at its port, two pieces at a drive's channel), so it falls
//! short of the bound its unloaded round trip gives even with nobody beside
//! it (fuzz case 1:76, a QD 2 host on a 9.2 Gb/s port, gets 92-97% of that
//! bound alone, as its random sizes fall, and the same under every mode).
//! No pacer can give a host more than it carries alone, so the oracle
//! scales the host's solo bound by what it reaches ([`super::ideal`]).

use std::collections::HashMap;

use pace::pacer::Mode;

use crate::hosts::Host;
use crate::scenario::{HostGroup, RunConfig, Scenario};

/// Each host's rate alone, bytes/s: one run per host group and port.
pub(super) fn rates(sc: &Scenario, run: &RunConfig, qd: u32, hosts: &[Host]) -> Vec<f64> {
    let mut seen: HashMap<(usize, usize), f64> = HashMap::new();
    hosts
        .iter()
        .map(|h| {
            *seen
                .entry((h.group, h.port))
                .or_insert_with(|| rate(sc, run, qd, h.group, h.port))
        })
        .collect()
}

/// One host of `group` on `port`, alone.
fn rate(sc: &Scenario, run: &RunConfig, qd: u32, group: usize, port: usize) -> f64 {
    let mut solo = sc.clone();
    solo.trace = false;
    solo.hosts = vec![HostGroup {
        count: 1,
        port: Some(port),
        ..sc.hosts[group].clone()
    }];
    let mut unpaced = run.clone();
    unpaced.pacing.mode = Mode::None;
    let row = crate::simulate(&solo, &unpaced, qd);
    row.per_host_gbps.first().copied().unwrap_or(0.0) * 1e9 / 8.0
}
