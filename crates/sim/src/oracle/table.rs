//! `iopace sim FILE`'s oracle table: per run and QD, each host group's
//! ideal rate per host beside what its hosts achieved, and the buffers
//! against the bandwidth-delay floor.

use super::{ideal, Limit};
use crate::report::Row;
use crate::scenario::Scenario;

const MIB: f64 = (1u64 << 20) as f64;

/// What holds a group's hosts, each limit once, in a fixed order.
fn held_by(limits: &[Limit]) -> String {
    [Limit::Qd, Limit::Link, Limit::Port, Limit::Device]
        .into_iter()
        .filter(|l| limits.contains(l))
        .map(|l| match l {
            Limit::Qd => "QD",
            Limit::Link => "link",
            Limit::Port => "port",
            Limit::Device => "drive",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One table per run: a row per (QD, host group).
pub fn render(sc: &Scenario, results: &[(String, Vec<Row>)]) -> String {
    let mut s = String::new();
    for ((label, rows), run) in results.iter().zip(&sc.runs) {
        s += &format!("**{label}, against the oracle**\n\n");
        s += "| QD, group | hosts | ideal Gb/s per host | achieved Gb/s (min-max) | worst % | Bufs (MiB) / floor | held by |\n";
        s += "|---|---|---|---|---|---|---|\n";
        for row in rows {
            let i = ideal(sc, run, row.qd);
            for g in 0..sc.hosts.len() {
                let hosts: Vec<usize> = (0..i.group.len()).filter(|&h| i.group[h] == g).collect();
                if hosts.is_empty() {
                    continue;
                }
                let want = |h: usize| i.host_bps[h] * 8e-9;
                let got = |h: usize| row.per_host_gbps[h];
                let mean_ideal = hosts.iter().map(|&h| want(h)).sum::<f64>() / hosts.len() as f64;
                let (lo, hi) = hosts.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &h| {
                    (lo.min(got(h)), hi.max(got(h)))
                });
                let worst = hosts
                    .iter()
                    .filter(|&&h| want(h) > 0.0)
                    .map(|&h| 100.0 * got(h) / want(h))
                    .fold(f64::INFINITY, f64::min);
                s += &format!(
                    "| {} g{g} | {} | {mean_ideal:.2} | {lo:.2}-{hi:.2} | {:.0} | {:.1} / {:.1} | {} |\n",
                    row.qd,
                    hosts.len(),
                    if worst.is_finite() { worst } else { 100.0 },
                    row.bufs_mib_avg,
                    i.floor_bytes / MIB,
                    held_by(&hosts.iter().map(|&h| i.limit[h]).collect::<Vec<_>>()),
                );
            }
        }
        s += "\n";
    }
    s
}
