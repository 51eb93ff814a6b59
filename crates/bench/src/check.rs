//! fio's numbers against what the target and the wire saw.
//!
//! fio's per-job bandwidth is wrong for a job whose IOs wait longer than the
//! ramp (a starved tenant: thousands of IOs reported at a mean latency its
//! queue depth cannot produce). A report that prints them unchecked shows a
//! host above its own wire. The target counts the data it moved per export,
//! and the wire counts what crossed each host's link; where they disagree
//! with fio, the report says so and the per-export table uses the target's.

use std::collections::BTreeMap;

use crate::result::RunResult;

/// fio's per-export BW may differ from the target's by this share (the
/// two windows differ by a sampling interval) ...
const EXPORT_TOLERANCE: f64 = 0.10;
/// ... or by this much, Gb/s, for exports that carried almost nothing.
const EXPORT_SLACK_GBPS: f64 = 0.01;
/// A host's payload can't exceed its wire (which adds headers); 3% covers
/// the two counters' different windows.
const WIRE_TOLERANCE: f64 = 1.03;

/// Where fio's numbers of one run disagree with the target or the wire, one
/// line each; empty when they agree or nothing else was measured.
pub fn fio_disagreements(r: &RunResult) -> Vec<String> {
    let mut out = Vec::new();
    for h in &r.fio.hosts {
        if let Some(wire) = h.wire_gbps.filter(|w| h.bw_gbps > w * WIRE_TOLERANCE) {
            out.push(format!(
                "{}: fio {:.3} Gb/s above its wire's {wire:.3}",
                h.host, h.bw_gbps
            ));
        }
    }
    for e in &r.fio.exports {
        let Some(&target) = r.stats.export_gbps.get(&e.host) else {
            continue;
        };
        let off = (e.bw_gbps - target).abs();
        if off > EXPORT_SLACK_GBPS && off > target * EXPORT_TOLERANCE {
            out.push(format!(
                "{}: fio {:.3} Gb/s, target {target:.3}",
                e.host, e.bw_gbps
            ));
        }
    }
    out
}

/// A run's bandwidth per export group (export names without trailing
/// digits: fast0..7 are "fast"), Gb/s, over the exports the workload ran
/// on: the target's own count where it has one (iopace), fio's otherwise
/// (peers).
pub fn export_groups(r: &RunResult) -> BTreeMap<String, f64> {
    let per_export: Vec<(&str, f64)> = r
        .fio
        .exports
        .iter()
        .map(|e| {
            let target = r.stats.export_gbps.get(&e.host).copied();
            (e.host.as_str(), target.unwrap_or(e.bw_gbps))
        })
        .collect();
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    for (name, bw) in per_export {
        *m.entry(group_of(name).to_string()).or_default() += bw;
    }
    m
}

/// An export's group: its name without trailing digits (fast0..7 are
/// "fast"), or the whole name if that leaves nothing.
pub fn group_of(name: &str) -> &str {
    let group = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if group.is_empty() {
        name
    } else {
        group
    }
}

/// A run's p99 completion latency per export group, us: fio's, of the
/// group's worst export (a QD 1 tenant beside a saturating one).
pub fn export_group_p99(r: &RunResult) -> BTreeMap<String, f64> {
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    for e in &r.fio.exports {
        let p99 = m.entry(group_of(&e.host).to_string()).or_default();
        *p99 = p99.max(e.p99_us);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fio::{FioResult, HostRow};

    fn run_with(exports: &[(&str, f64, Option<f64>)]) -> RunResult {
        let mut fio = FioResult::default();
        let mut stats = crate::result::TargetStats::default();
        for &(name, fio_bw, target_bw) in exports {
            fio.exports.push(HostRow {
                host: name.into(),
                bw_gbps: fio_bw,
                ..HostRow::default()
            });
            if let Some(t) = target_bw {
                stats.export_gbps.insert(name.into(), t);
            }
        }
        RunResult {
            test: "t".into(),
            key: "k".into(),
            point: 0,
            vars: BTreeMap::new(),
            target: "iopace".into(),
            rep: 0,
            total_qd: 8,
            job_iodepth: 8,
            fio,
            stats,
            window_s: 1.0,
        }
    }

    #[test]
    fn a_starved_export_that_fio_overcounts_is_named() {
        // The tenants_slow case: fio 0.556 Gb/s for an export the target
        // finished 0.008 Gb/s of replies on; the fast exports agree.
        let r = run_with(&[
            ("fast0", 0.470, Some(0.472)),
            ("slow0", 0.556, Some(0.008)),
            ("slow1", 0.012, Some(0.015)),
        ]);
        let d = fio_disagreements(&r);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("slow0: fio 0.556"), "{d:?}");
    }

    #[test]
    fn a_host_above_its_wire_is_named() {
        let mut r = run_with(&[]);
        r.fio.hosts.push(HostRow {
            host: "h1".into(),
            bw_gbps: 2.065,
            wire_gbps: Some(1.918),
            ..HostRow::default()
        });
        r.fio.hosts.push(HostRow {
            host: "h2".into(),
            bw_gbps: 1.85,
            wire_gbps: Some(1.918),
            ..HostRow::default()
        });
        let d = fio_disagreements(&r);
        assert_eq!(
            d,
            vec!["h1: fio 2.065 Gb/s above its wire's 1.918".to_string()]
        );
    }

    #[test]
    fn groups_leave_out_exports_the_workload_did_not_use() {
        let mut r = run_with(&[("default", 1.9, Some(1.91))]);
        r.stats.export_gbps.insert("null".into(), 0.0);
        r.stats.export_gbps.insert("slow".into(), 0.0);
        let g = export_groups(&r);
        assert_eq!(g.len(), 1, "{g:?}");
        assert!((g["default"] - 1.91).abs() < 1e-9);
    }

    #[test]
    fn groups_take_the_targets_count_over_fios() {
        let r = run_with(&[
            ("fast0", 1.0, Some(1.1)),
            ("fast1", 2.0, Some(2.0)),
            ("slow0", 0.5, Some(0.05)),
        ]);
        let g = export_groups(&r);
        assert!(
            (g["fast"] - 3.1).abs() < 1e-9 && (g["slow"] - 0.05).abs() < 1e-9,
            "{g:?}"
        );
        // A peer has no target counts: fio's.
        let peer = run_with(&[("fast0", 1.0, None), ("slow0", 0.5, None)]);
        let g = export_groups(&peer);
        assert_eq!((g["fast"], g["slow"]), (1.0, 0.5));
    }
}
