//! What a probe measures besides its curves: the cost points, each
//! direction's latency alone (QD 1), the datasheet's 8 KiB points and the
//! held-out mixes; and what their rows give: the cost points, the latency
//! line and the held-out predictions.

use crate::driver::{Measurement, Workload};
use crate::fit::{self, CostPoints, LARGE, SMALL};
use crate::qd_search::Trace;
use crate::Prediction;

/// IOs in flight for the small cost points when no search found their
/// peak, and for the 8 KiB datasheet points, the 70/30 4 KiB mix, the
/// thread scaling and several devices at once.
pub const COST_QD_SMALL: u32 = 64;
/// IOs in flight for the large (128 KiB) sequential cost points when no
/// search found their peak.
pub const COST_QD_LARGE: u32 = 32;

/// IOs in flight for the 4 KiB/64 KiB held-out mix (issue 12's example).
pub const MIX_QD: u32 = 32;

/// The sizes whose latency alone (QD 1) gives each direction's unloaded
/// latency line: the small random and the large sequential cost point's.
const UNLOADED: [(u32, bool); 2] = [(SMALL, true), (LARGE, false)];

pub const fn workload(read_pct: u32, bs: u32, random: bool) -> Workload {
    Workload {
        read_pct,
        bs,
        random,
        alt_bs: None,
    }
}

/// A cost point, datasheet point or held-out mix: label, workload, QD and
/// the measurement (the median of its rounds).
pub type Row = (String, Workload, u32, Measurement);
/// A point's label and its IOPS in every round.
pub type Rounds = (String, Vec<f64>);

/// A point measured once in every round of alternation.
#[derive(Debug, Clone, PartialEq)]
pub struct Fixed {
    pub label: String,
    pub w: Workload,
    pub qd: u32,
}

fn direction(read_pct: u32) -> &'static str {
    if read_pct == 100 {
        "read"
    } else {
        "write"
    }
}

/// One direction's three cost points (large sequential, small sequential,
/// small random), at the QDs used when no search found their peak.
pub fn cost_plan(read_pct: u32) -> [Fixed; 3] {
    let dir = direction(read_pct);
    [
        (
            format!("seq {dir} {}KiB", LARGE >> 10),
            workload(read_pct, LARGE, false),
            COST_QD_LARGE,
        ),
        (
            format!("seq {dir} 4KiB"),
            workload(read_pct, SMALL, false),
            COST_QD_SMALL,
        ),
        (
            format!("rand {dir} 4KiB"),
            workload(read_pct, SMALL, true),
            COST_QD_SMALL,
        ),
    ]
    .map(|(label, w, qd)| Fixed { label, w, qd })
}

/// The cost points of the directions measured: writes first, since they
/// also fill a fresh file, so the reads that follow reach the disk.
pub fn cost_points_plan(writes: bool) -> Vec<Fixed> {
    let dirs: &[u32] = if writes { &[0, 100] } else { &[100] };
    dirs.iter().flat_map(|d| cost_plan(*d)).collect()
}

/// Whether `f` is a cost point (of either direction), at whatever QD.
pub fn is_cost_point(f: &Fixed) -> bool {
    [0, 100]
        .iter()
        .flat_map(|d| cost_plan(*d))
        .any(|c| c.label == f.label && c.w == f.w)
}

/// The cost points, each at the QD its search found (`peaks`, by label;
/// else its default), each direction's IOs alone, the datasheet's 8 KiB
/// random points and the held-out mixes the cost model is checked against.
pub fn fixed_plan(writes: bool, peaks: &[Trace]) -> Vec<Fixed> {
    let dirs: &[u32] = if writes { &[0, 100] } else { &[100] };
    let mut plan = cost_points_plan(writes);
    for f in &mut plan {
        if let Some(t) = peaks.iter().find(|t| t.label == f.label) {
            f.qd = t.qd;
        }
    }
    // Each IO alone: what the prediction at a QD below the knee needs.
    for d in dirs {
        for (bs, random) in UNLOADED {
            plan.push(Fixed {
                label: format!(
                    "{} {} {}KiB QD 1",
                    if random { "rand" } else { "seq" },
                    direction(*d),
                    bs >> 10
                ),
                w: workload(*d, bs, random),
                qd: 1,
            });
        }
    }
    plan.extend(dirs.iter().map(|d| Fixed {
        label: format!("rand {} 8KiB", direction(*d)),
        w: workload(*d, 8192, true),
        qd: COST_QD_SMALL,
    }));
    if writes {
        plan.push(Fixed {
            label: "70/30 random 4KiB".into(),
            w: workload(70, SMALL, true),
            qd: COST_QD_SMALL,
        });
        plan.push(Fixed {
            label: "70/30 random 4KiB/64KiB".into(),
            w: Workload {
                alt_bs: Some(64 << 10),
                ..workload(70, SMALL, true)
            },
            qd: MIX_QD,
        });
    }
    plan
}

/// One direction's cost points out of the measured rows (found by label,
/// each at the QD it was measured at), and those QDs (large sequential,
/// small sequential, small random).
pub fn cost_points(rows: &[Row], read_pct: u32) -> Option<(CostPoints, [u32; 3])> {
    let row = |f: &Fixed| rows.iter().find(|r| r.0 == f.label && r.1 == f.w);
    let [large, small, rand] = cost_plan(read_pct).map(|f| row(&f));
    let (large, small, rand) = (large?, small?, rand?);
    Some((
        CostPoints {
            seq_large_iops: large.3.iops,
            seq_small_iops: small.3.iops,
            rand_small_iops: rand.3.iops,
        },
        [large.2, small.2, rand.2],
    ))
}

/// One direction's latency alone out of the measured QD 1 rows (the mean
/// latency: one over the rate at QD 1); none if they were not measured.
pub fn unloaded(rows: &[Row], read_pct: u32) -> Option<fit::Unloaded> {
    let alone = |(bs, random): (u32, bool)| {
        rows.iter()
            .find(|r| r.1 == workload(read_pct, bs, random) && r.2 == 1)
            .map(|r| 1.0 / r.3.iops)
    };
    let [small, large] = UNLOADED.map(alone);
    Some(fit::Unloaded::through(small?, large?))
}

/// One direction's cost points at saturation: each point's time less the
/// share of its latency alone its QD did not hide (`fit::saturated_cost_s`).
fn saturated((p, qds): &(CostPoints, [u32; 3]), u: &fit::Unloaded) -> CostPoints {
    let at = |rate: f64, qd: u32, bs: u32| 1.0 / fit::saturated_cost_s(rate, qd, u.of(bs));
    CostPoints {
        seq_large_iops: at(p.seq_large_iops, qds[0], LARGE),
        seq_small_iops: at(p.seq_small_iops, qds[1], SMALL),
        rand_small_iops: at(p.rand_small_iops, qds[2], SMALL),
    }
}

/// The held-out mixes predicted at their QD: the linear model of the
/// saturated cost points gives the capacity, each IO's latency alone the
/// rate below the knee (`fit::iops_at_qd`). Without QD 1 points, the
/// capacity of the cost model as measured.
pub fn predictions(
    rows: &[Row],
    cost: &pace::pacer::CostModel,
    read: &(CostPoints, [u32; 3]),
    write: Option<&(CostPoints, [u32; 3])>,
) -> Vec<Prediction> {
    let read_u = unloaded(rows, 100);
    let write_u = if write.is_some() {
        unloaded(rows, 0)
    } else {
        read_u
    };
    let lat = read_u.zip(write_u);
    let capacity = lat.map(|(ru, wu)| {
        fit::cost_model(
            &saturated(read, &ru),
            write.map(|w| saturated(w, &wu)).as_ref(),
        )
    });
    rows.iter()
        .filter(|r| r.1.read_pct != 0 && r.1.read_pct != 100)
        .map(|r| {
            let (w, qd) = (r.1, r.2);
            let sizes = w.sizes();
            let linear_iops = fit::predicted_iops(cost, w.read_pct, &sizes);
            let (capacity_iops, unloaded_us, predicted_iops) = match (capacity, lat) {
                (Some(c), Some((ru, wu))) => {
                    let cost_s = fit::mix_cost_s(&c, w.read_pct, &sizes);
                    let alone_s = fit::mix_unloaded_s(&ru, &wu, w.read_pct, &sizes);
                    (
                        1.0 / cost_s,
                        alone_s * 1e6,
                        fit::iops_at_qd(cost_s, alone_s, qd),
                    )
                }
                _ => (linear_iops, 0.0, linear_iops),
            };
            Prediction {
                workload: w,
                qd,
                predicted_iops,
                linear_iops,
                capacity_iops,
                unloaded_us,
                measured: r.3,
            }
        })
        .collect()
}

/// A round of a point, for tests: its IOPS and p99, half a second long.
#[cfg(test)]
pub(crate) fn test_round(iops: f64, p99_us: f64) -> Measurement {
    Measurement {
        iops,
        p99_us,
        secs: 0.5,
        ..Measurement::default()
    }
}

#[cfg(test)]
mod tests {
    use super::test_round as round;
    use super::*;

    #[test]
    fn the_plan_holds_cost_datasheet_and_held_out_points() {
        let plan = fixed_plan(true, &[]);
        let labels: Vec<&str> = plan.iter().map(|f| f.label.as_str()).collect();
        assert_eq!(
            labels[0], "seq write 128KiB",
            "writes first: they fill a fresh file"
        );
        // No IO larger than the server sends a device (its default buffer).
        let buffer = config::BufferConfig::default().buffer_size.0;
        assert!(plan.iter().all(|f| u64::from(f.w.max_bs()) <= buffer));
        for l in [
            "seq read 128KiB",
            "rand read 8KiB",
            "rand write 8KiB",
            "70/30 random 4KiB",
            "70/30 random 4KiB/64KiB",
        ] {
            assert!(labels.contains(&l), "{l} in {labels:?}");
        }
        let mix = plan.last().expect("a mix");
        assert_eq!((mix.w.alt_bs, mix.qd), (Some(64 << 10), MIX_QD));
        assert_eq!(
            fixed_plan(false, &[]).len(),
            6,
            "reads only: 3 cost points, 2 alone and 8 KiB"
        );
        for l in [
            "rand read 4KiB QD 1",
            "seq read 128KiB QD 1",
            "rand write 4KiB QD 1",
            "seq write 128KiB QD 1",
        ] {
            let f = plan.iter().find(|f| f.label == l);
            assert_eq!(f.map(|f| f.qd), Some(1), "{l} in {labels:?}");
        }
    }

    fn row(w: Workload, qd: u32, iops: f64) -> Row {
        (String::new(), w, qd, round(iops, 0.0))
    }

    #[test]
    fn held_out_mixes_are_predicted_at_their_qd() {
        // A linear device, 30 us and 1 ns a byte an IO when busy, both
        // ways; an IO alone takes 300 us whatever its size.
        let cost_s = |bs: u32| 30e-6 + f64::from(bs) * 1e-9;
        let alone_s = 300e-6;
        let mix = Workload {
            alt_bs: Some(64 << 10),
            ..workload(70, SMALL, true)
        };
        let mut rows = vec![row(mix, 8, 1.0)];
        for d in [0, 100] {
            // The cost points as measured at their QD: below the knee.
            for f in cost_plan(d) {
                let rate = fit::iops_at_qd(cost_s(f.w.bs), alone_s, f.qd);
                rows.push((f.label, f.w, f.qd, round(rate, 0.0)));
            }
            for (bs, random) in UNLOADED {
                rows.push(row(workload(d, bs, random), 1, 1.0 / alone_s));
            }
        }
        let read = cost_points(&rows, 100).expect("read points");
        let write = cost_points(&rows, 0).expect("write points");
        assert_eq!(read.1, [COST_QD_LARGE, COST_QD_SMALL, COST_QD_SMALL]);
        let cost = fit::cost_model(&read.0, Some(&write.0));
        let p = predictions(&rows, &cost, &read, Some(&write));
        assert_eq!(p.len(), 1);
        let p = p[0];
        assert!((p.unloaded_us - 300.0).abs() < 1e-6, "{}", p.unloaded_us);
        // The capacity is the device's, not the cost points' rate below their knee.
        let mix_cost_s = (cost_s(SMALL) + cost_s(64 << 10)) / 2.0;
        assert!((p.capacity_iops * mix_cost_s - 1.0).abs() < 1e-6);
        assert!(p.linear_iops < p.capacity_iops);
        let at_8 = fit::iops_at_qd(mix_cost_s, alone_s, 8);
        assert!((p.predicted_iops / at_8 - 1.0).abs() < 1e-6);
        // Without the QD 1 points: the linear model as it was.
        rows.retain(|r| r.2 != 1);
        let p = predictions(&rows, &cost, &read, Some(&write))[0];
        assert_eq!((p.predicted_iops, p.unloaded_us), (p.linear_iops, 0.0));
    }
}
