//! The probe's peak search and fit against the `model` bdev's own timing
//! (`bdev::ModelState`) in virtual time. This is deterministic, so it
//! checks exactly, under any machine load, what `tests/probe_model.rs` used
//! to check against a wall clock: the six parameters come back (within 1%
//! here; the goal is 10%) and the knee within one QD step. How close the real probe
//! gets on a real clock, and how long it takes, is measured by the benchmark
//! `scripts/probe-accuracy.sh` (BENCHMARKS.md).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bdev::{IoOp, ModelParams, ModelState};
use pace::pacer::CostModel;

use super::{cost_of, peaks_of};
use crate::driver::Workload;
use crate::fit::{self, SMALL};
use crate::plan::{self, test_round, workload, Row};

/// Completions dropped while the queue fills, then completions timed.
const WARM: u64 = 100;
const TIMED: u64 = 1000;

/// IOPS of `qd` IOs of `w` kept in flight on a model device, as the
/// probe's driver keeps them: a sequential workload's offsets follow each
/// other in issue order, a random one's are scattered.
fn closed_loop(p: &ModelParams, w: &Workload, qd: u32) -> f64 {
    let mut s = ModelState::new(p);
    let op = if w.read_pct == 100 {
        IoOp::Read
    } else {
        assert_eq!(w.read_pct, 0, "a cost point is one direction");
        IoOp::Write { fua: false }
    };
    let bs = u64::from(w.bs);
    let offset = |i: u64| {
        let block = if w.random { i * 7919 % 100_003 } else { i };
        block * bs
    };
    let mut issued = 0;
    let mut admit = |s: &mut ModelState, now: u64| {
        issued += 1;
        Reverse(s.admit(p, now, op, offset(issued), w.bs))
    };
    let mut pending: BinaryHeap<Reverse<u64>> = (0..qd).map(|_| admit(&mut s, 0)).collect();
    let mut start = 0;
    for done in 1..=WARM + TIMED {
        let Reverse(t) = pending.pop().expect("qd IOs in flight");
        if done == WARM {
            start = t;
        }
        pending.push(admit(&mut s, t));
        if done == WARM + TIMED {
            return TIMED as f64 * 1e9 / (t - start) as f64;
        }
    }
    unreachable!("the loop returns at its last completion")
}

/// The probe's cost phase in virtual time: each cost point's peak search
/// up to QD 64, the point measured at its peak, the model fitted; and the
/// knee of the 4 KiB random read curve over QD 1-64.
fn probe(p: &ModelParams) -> (CostModel, Option<u32>) {
    let points = plan::cost_points_plan(true);
    let rate = |f: &plan::Fixed, qd| Ok(closed_loop(p, &f.w, qd));
    let peaks = peaks_of("model", &points, 64, rate).expect("every search ends");
    let rows: Vec<Row> = points
        .iter()
        .zip(&peaks)
        .map(|(f, t)| {
            let iops = closed_loop(p, &f.w, t.qd);
            (f.label.clone(), f.w, t.qd, test_round(iops, 0.0))
        })
        .collect();
    let (_, _, cost) = cost_of(&rows, true).expect("every cost point measured");
    let read = workload(100, SMALL, true);
    let curve: Vec<(u32, f64)> = (0..=6)
        .map(|i| (1 << i, closed_loop(p, &read, 1 << i)))
        .collect();
    (cost, fit::knee(&curve))
}

fn shape(cost: [f64; 6], latency_us: u64, channels: u32, knee: (u32, u64)) -> ModelParams {
    let [rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops] = cost;
    ModelParams {
        cost: CostModel {
            rbps,
            rseqiops,
            rrandiops,
            wbps,
            wseqiops,
            wrandiops,
        },
        latency_ns: latency_us * 1000,
        channels,
        knee_qd: knee.0,
        knee_ns: knee.1 * 1000,
    }
}

/// The shapes of tests/probe_model.rs (with the knee QD they must show),
/// of tests/probe_iocost.rs and of docs/results/probe-peak-qd-2026-11-28.
/// A knee: the smallest power-of-two QD whose 4 KiB random read IOPS,
/// min(QD / (service + latency + growth), 1 / service), reach 95% of
/// 1 / service (service = 1/rrandiops + 4096/rbps): fast 2 (220 us + 100
/// us), slow 4 (1041 us + 2 ms; QD 2 gives 68%), knee 8 (264 us + 1 ms +
/// 100 us an IO past 8; QD 4 gives 83%).
fn shapes() -> Vec<(&'static str, ModelParams, Option<u32>)> {
    vec![
        (
            "fast (probe_model)",
            shape([200e6, 1e4, 5e3, 100e6, 5e3, 2.5e3], 100, 256, (0, 0)),
            Some(2),
        ),
        (
            "slow (probe_model)",
            shape([100e6, 3e3, 1e3, 100e6, 2e3, 800.0], 2000, 256, (0, 0)),
            Some(4),
        ),
        (
            "knee (probe_model)",
            shape([300e6, 8e3, 4e3, 200e6, 6e3, 3e3], 1000, 256, (8, 100)),
            Some(8),
        ),
        (
            "knee (probe_iocost)",
            shape([120e6, 9e3, 4e3, 40e6, 3e3, 900.0], 700, 64, (24, 300)),
            None,
        ),
        (
            "few (probe_iocost)",
            shape([40e6, 2e3, 1e3, 20e6, 1e3, 500.0], 1000, 4, (0, 0)),
            None,
        ),
        (
            "knee (the issue's)",
            shape([1.2e9, 9e4, 4e4, 4e8, 3e4, 9e3], 70, 64, (24, 30)),
            None,
        ),
        (
            "few",
            shape([400e6, 2e4, 1e4, 200e6, 1e4, 5e3], 100, 4, (0, 0)),
            None,
        ),
        (
            "slow",
            shape(
                [150e6, 2e3, 200.0, 120e6, 1.5e3, 150.0],
                4000,
                32,
                (16, 2000),
            ),
            None,
        ),
        (
            "fast",
            shape([3e9, 3e5, 2e5, 2e9, 1.5e5, 1e5], 20, 256, (0, 0)),
            None,
        ),
    ]
}

#[test]
fn the_search_and_fit_recover_every_models_parameters_and_knee() {
    for (name, p, knee) in shapes() {
        let (cost, found) = probe(&p);
        for ((param, got), (_, want)) in cost.named().into_iter().zip(p.cost.named()) {
            let err = got / want - 1.0;
            // Exact in virtual time, up to the model's rounding to whole ns.
            assert!(
                err.abs() < 0.01,
                "{name}: {param} = {got:.0}, truth {want:.0}"
            );
        }
        if let Some(knee) = knee {
            let found = f64::from(found.expect("a knee"));
            let steps = (found.log2() - f64::from(knee).log2()).abs();
            assert!(steps <= 1.0, "{name}: knee QD {found}, truth {knee}");
        }
    }
}

#[test]
fn the_issues_sequential_reads_peak_before_the_knee() {
    // 4 KiB sequential reads reach their full rate (1 / (1/90,000 +
    // 4096 B/1.2 GB/s) = 68,900 IOPS) only between the latency bound and
    // the knee: at the old fixed QD 64, rseqiops came out -36%.
    let p = shapes().into_iter().find(|s| s.0 == "knee (the issue's)");
    let p = p.expect("the issue's shape").1;
    let seq = workload(100, SMALL, false);
    let full = 1e9 / p.service_ns(pace::pacer::IoKind::Read, SMALL, true);
    let at = |qd| closed_loop(&p, &seq, qd) / full;
    assert!(at(64) < 0.75, "QD 64: {:.2}", at(64));
    let points = plan::cost_plan(100);
    let rate = |f: &plan::Fixed, qd| Ok(closed_loop(&p, &f.w, qd));
    let peaks = peaks_of("model", &points[1..2], 64, rate).expect("search");
    assert!((8..=32).contains(&peaks[0].qd), "{:?}", peaks[0]);
    assert!(
        at(peaks[0].qd) > 0.97,
        "QD {}: {:.2}",
        peaks[0].qd,
        at(peaks[0].qd)
    );
}
