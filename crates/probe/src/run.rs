//! The order of a probe: cost points, QD curves, scaling, the held-out mix,
//! then several devices at once.

use std::time::Instant;

use indicatif::ProgressBar;

use crate::converge::StopRule;
use crate::driver::{measure, Job, Measurement, Workload};
use crate::fit::{self, CostPoints, LARGE, SMALL};
use crate::{
    open_targets, report, spec, Curve, DeviceResult, MultiDevice, Options, Point, Prediction,
    ProbeError, ProbeResult, Target,
};

/// IOs in flight for the small cost points: past the knee of most devices.
pub const COST_QD_SMALL: u32 = 64;
/// IOs in flight for the large (128 KiB) sequential cost points.
pub const COST_QD_LARGE: u32 = 32;

/// IOs in flight for the 4 KiB/64 KiB held-out mix (issue 12's example).
pub const MIX_QD: u32 = 32;

/// The sizes whose latency alone (QD 1) gives each direction's unloaded
/// latency line: the small random and the large sequential cost point's.
const UNLOADED: [(u32, bool); 2] = [(SMALL, true), (LARGE, false)];

const fn workload(read_pct: u32, bs: u32, random: bool) -> Workload {
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
struct Fixed {
    label: String,
    w: Workload,
    qd: u32,
}

fn direction(read_pct: u32) -> &'static str {
    if read_pct == 100 {
        "read"
    } else {
        "write"
    }
}

/// One direction's three cost points.
fn cost_plan(read_pct: u32) -> [Fixed; 3] {
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

/// The cost points, the datasheet's 8 KiB random points and the held-out
/// mixes the cost model is checked against.
fn fixed_plan(writes: bool) -> Vec<Fixed> {
    // Writes first: they also fill a fresh file, so the reads that follow reach the disk.
    let dirs: &[u32] = if writes { &[0, 100] } else { &[100] };
    let mut plan: Vec<Fixed> = dirs.iter().flat_map(|d| cost_plan(*d)).collect();
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

/// Probes every target and writes the report; returns what it measured.
pub fn probe(opts: &Options) -> Result<ProbeResult, ProbeError> {
    let targets = open_targets(opts)?;
    let rated = opts.spec.as_deref().map(spec::load).transpose()?;
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| ProbeError::Usage(format!("{}: {e}", opts.out.display())))?;
    let bar = bench::run::progress(targets.iter().map(|t| points_of(t, opts)).sum::<u64>());
    for t in &targets {
        if let Some(why) = &t.write_refusal {
            bar.println(format!("{}: reads only. {why}", t.name));
        }
        if let Some(warning) = sparse_warning(t) {
            bar.println(warning);
        }
    }
    let mut devices = Vec::new();
    for t in &targets {
        devices.push(device(t, opts, &bar)?);
    }
    let multi = if targets.len() > 1 {
        Some(together(&targets, &devices, opts, &bar)?)
    } else {
        None
    };
    for d in &mut devices {
        d.spec = rated.as_ref().map(|r| spec::compare(r, d, multi.as_ref()));
    }
    bar.finish_and_clear();
    let result = ProbeResult {
        command: opts.command.clone(),
        machine: bench::report::machine(),
        quick: opts.quick,
        devices,
        multi,
    };
    report::write(&opts.out, &result).map_err(ProbeError::Run)?;
    Ok(result)
}

fn qds(opts: &Options) -> Vec<u32> {
    let max = if opts.quick {
        opts.max_qd.min(64)
    } else {
        opts.max_qd
    };
    (0..=9)
        .map(|i| 1 << i)
        .filter(|q| *q <= max.max(1))
        .collect()
}

fn thread_counts(opts: &Options) -> Vec<u32> {
    (0..=6)
        .map(|i| 1 << i)
        .filter(|t| *t <= opts.threads.max(1))
        .collect()
}

fn points_of(t: &Target, opts: &Options) -> u64 {
    let writes = t.write_refusal.is_none();
    let fixed = fixed_plan(writes).len() as u64 * u64::from(opts.rounds());
    let curves = if writes { 3 } else { 2 };
    fixed + curves * qds(opts).len() as u64 + thread_counts(opts).len() as u64
}

/// A file with holes reads zeros without touching the disk.
fn sparse_warning(t: &Target) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&t.name).ok()?;
    let allocated = meta.blocks() * 512;
    (meta.is_file() && allocated < meta.len() / 10 * 9).then(|| {
        format!(
            "{}: warning: only {} of {} bytes are allocated; reads of holes never reach the disk \
             (write the file once first, e.g. with dd)",
            t.name,
            allocated,
            meta.len()
        )
    })
}

fn point(
    bar: &ProgressBar,
    jobs: &[Job],
    w: &Workload,
    rule: &StopRule,
    label: &str,
) -> Result<Measurement, ProbeError> {
    bar.set_message(label.to_string());
    let m = measure(jobs, w, rule).map_err(|e| ProbeError::Run(format!("{label}: {e}")))?;
    bar.inc(1);
    Ok(m)
}

/// A job of `qd` IOs on `t`; `measure` gives it the point's workload.
fn job(t: &Target, qd: u32) -> Job {
    Job {
        dev: t.bdev.clone(),
        qd,
        workload: workload(100, SMALL, true),
        throttle: None,
    }
}

fn single(t: &Target, qd: u32) -> Vec<Job> {
    vec![job(t, qd)]
}

/// Measures every point of `plan` once a round, alternating, so a drift of
/// the device or the machine spreads over all points instead of skewing
/// one; each point is the median of its rounds. Returns the rows and every
/// round's IOPS.
fn measure_plan(
    t: &Target,
    plan: &[Fixed],
    opts: &Options,
    bar: &ProgressBar,
) -> Result<(Vec<Row>, Vec<Rounds>), ProbeError> {
    let rule = opts.round_rule();
    let mut seen: Vec<Vec<Measurement>> = plan.iter().map(|_| Vec::new()).collect();
    for _ in 0..opts.rounds() {
        for (f, seen) in plan.iter().zip(&mut seen) {
            let label = format!("{}: {}", t.name, f.label);
            seen.push(point(bar, &single(t, f.qd), &f.w, &rule, &label)?);
        }
    }
    let rounds = plan
        .iter()
        .zip(&seen)
        .map(|(f, ms)| (f.label.clone(), ms.iter().map(|m| m.iops).collect()))
        .collect();
    let rows = plan
        .iter()
        .zip(seen)
        .map(|(f, ms)| (f.label.clone(), f.w, f.qd, median_round(ms, &rule)))
        .collect();
    Ok((rows, rounds))
}

/// A point from its rounds: the median round's IOPS (robust to a round
/// the disk stalled in) and latencies, the 95% interval of the round rates,
/// and the time of all rounds. One round is the point itself.
fn median_round(mut rounds: Vec<Measurement>, rule: &StopRule) -> Measurement {
    debug_assert!(!rounds.is_empty(), "a point of no rounds");
    if rounds.len() == 1 {
        return rounds[0];
    }
    let rates: Vec<f64> = rounds.iter().map(|m| m.iops).collect();
    let (_, rel_ci) = crate::converge::mean_and_rel_ci(&rates);
    let secs = rounds.iter().map(|m| m.secs).sum();
    rounds.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    let mid = rounds.len() / 2;
    let mut m = rounds[mid];
    if rounds.len().is_multiple_of(2) {
        // The median of an even count: the middle two's mean.
        let low = rounds[mid - 1];
        m.iops = (m.iops + low.iops) / 2.0;
        m.bytes_per_s = (m.bytes_per_s + low.bytes_per_s) / 2.0;
    }
    Measurement {
        rel_ci,
        converged: rel_ci <= rule.ci,
        secs,
        ..m
    }
}

/// One direction's cost points out of the measured rows.
fn cost_points(rows: &[Row], read_pct: u32) -> Option<CostPoints> {
    let rate = |f: &Fixed| {
        rows.iter()
            .find(|r| r.1 == f.w && r.2 == f.qd)
            .map(|r| r.3.iops)
    };
    let [large, small, rand] = cost_plan(read_pct);
    Some(CostPoints {
        seq_large_iops: rate(&large)?,
        seq_small_iops: rate(&small)?,
        rand_small_iops: rate(&rand)?,
    })
}

/// One direction's latency alone out of the measured QD 1 rows (the mean
/// latency: one over the rate at QD 1); none if they were not measured.
fn unloaded(rows: &[Row], read_pct: u32) -> Option<fit::Unloaded> {
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
fn saturated(p: &CostPoints, u: &fit::Unloaded) -> CostPoints {
    let at = |rate: f64, qd: u32, bs: u32| 1.0 / fit::saturated_cost_s(rate, qd, u.of(bs));
    CostPoints {
        seq_large_iops: at(p.seq_large_iops, COST_QD_LARGE, LARGE),
        seq_small_iops: at(p.seq_small_iops, COST_QD_SMALL, SMALL),
        rand_small_iops: at(p.rand_small_iops, COST_QD_SMALL, SMALL),
    }
}

/// The held-out mixes predicted at their QD: the linear model of the
/// saturated cost points gives the capacity, each IO's latency alone the
/// rate below the knee (`fit::iops_at_qd`). Without QD 1 points, the
/// capacity of the cost model as measured.
fn predictions(
    rows: &[Row],
    cost: &pace::pacer::CostModel,
    read: &CostPoints,
    write: Option<&CostPoints>,
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

/// The read cost points alone, measured now (for `tune` without a cost model).
pub(crate) fn read_cost_points(t: &Target, opts: &Options) -> Result<CostPoints, ProbeError> {
    let bar = ProgressBar::hidden();
    let (rows, _) = measure_plan(t, &cost_plan(100), opts, &bar)?;
    cost_points(&rows, 100).ok_or_else(|| ProbeError::Run("read cost points missing".into()))
}

fn curve(
    t: &Target,
    label: &str,
    w: Workload,
    opts: &Options,
    bar: &ProgressBar,
) -> Result<Curve, ProbeError> {
    let mut points = Vec::new();
    for qd in qds(opts) {
        let m = point(
            bar,
            &single(t, qd),
            &w,
            &opts.rule(),
            &format!("{}: {label} QD {qd}", t.name),
        )?;
        points.push(crate::Point { x: qd, m });
    }
    let iops: Vec<(u32, f64)> = points.iter().map(|p| (p.x, p.m.iops)).collect();
    Ok(Curve {
        label: label.to_string(),
        workload: w,
        knee_qd: fit::knee(&iops),
        points,
    })
}

fn device(t: &Target, opts: &Options, bar: &ProgressBar) -> Result<DeviceResult, ProbeError> {
    let start = Instant::now();
    let writes = t.write_refusal.is_none();
    let (cost_rows, round_iops) = measure_plan(t, &fixed_plan(writes), opts, bar)?;
    let missing = || ProbeError::Run(format!("{}: cost points missing", t.name));
    let read = cost_points(&cost_rows, 100).ok_or_else(missing)?;
    let write = if writes {
        Some(cost_points(&cost_rows, 0).ok_or_else(missing)?)
    } else {
        None
    };
    let cost = fit::cost_model(&read, write.as_ref());
    let cost_s = start.elapsed().as_secs_f64();
    let predictions = predictions(&cost_rows, &cost, &read, write.as_ref());
    let curves = curves(t, writes, opts, bar)?;
    let mut thread_scaling = Vec::new();
    for threads in thread_counts(opts) {
        let jobs: Vec<Job> = (0..threads)
            .map(|_| job(t, (COST_QD_SMALL / threads).max(1)))
            .collect();
        let label = format!("{}: 4KiB random read, {threads} threads", t.name);
        let m = point(
            bar,
            &jobs,
            &workload(100, SMALL, true),
            &opts.rule(),
            &label,
        )?;
        thread_scaling.push(Point { x: threads, m });
    }
    Ok(DeviceResult {
        name: t.name.clone(),
        identity: t.identity.clone(),
        cost,
        cost_points: cost_rows,
        round_iops,
        write_refusal: t.write_refusal.clone(),
        curves,
        thread_scaling,
        predictions,
        spec: None,
        cost_s,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

fn curves(
    t: &Target,
    writes: bool,
    opts: &Options,
    bar: &ProgressBar,
) -> Result<Vec<Curve>, ProbeError> {
    let mut curves = vec![curve(
        t,
        "4KiB random read",
        workload(100, SMALL, true),
        opts,
        bar,
    )?];
    if writes {
        curves.push(curve(
            t,
            "4KiB random write",
            workload(0, SMALL, true),
            opts,
            bar,
        )?);
    }
    curves.push(curve(
        t,
        "128KiB sequential read",
        workload(100, 128 << 10, false),
        opts,
        bar,
    )?);
    Ok(curves)
}

/// 4 KiB random reads on every device at once, against the sum alone.
fn together(
    targets: &[Target],
    devices: &[DeviceResult],
    opts: &Options,
    bar: &ProgressBar,
) -> Result<MultiDevice, ProbeError> {
    bar.inc_length(1);
    let jobs: Vec<Job> = targets.iter().map(|t| job(t, COST_QD_SMALL)).collect();
    let w = workload(100, SMALL, true);
    let together = point(
        bar,
        &jobs,
        &w,
        &opts.rule(),
        "all devices: 4KiB random read",
    )?;
    let sum_alone_iops = devices
        .iter()
        .filter_map(|d| {
            d.cost_points
                .iter()
                .find(|p| p.1 == w && p.2 == COST_QD_SMALL)
        })
        .map(|p| p.3.iops)
        .sum();
    Ok(MultiDevice {
        devices: targets.iter().map(|t| t.name.clone()).collect(),
        sum_alone_iops,
        together,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(iops: f64, p99_us: f64) -> Measurement {
        Measurement {
            iops,
            p99_us,
            secs: 0.5,
            ..Measurement::default()
        }
    }

    #[test]
    fn a_point_is_its_median_round_with_the_rounds_interval() {
        let rule = StopRule::device();
        // A round the disk stalled in (10) moves the median, not the mean, little.
        let m = median_round(
            vec![round(100.0, 1.0), round(10.0, 9.0), round(104.0, 2.0)],
            &rule,
        );
        assert_eq!((m.iops, m.p99_us, m.secs), (100.0, 1.0, 1.5));
        let (_, ci) = crate::converge::mean_and_rel_ci(&[100.0, 10.0, 104.0]);
        assert_eq!(m.rel_ci, ci);
        assert!(!m.converged);
        let even = [98.0, 102.0, 101.0, 99.0].map(|x| round(x, 1.0)).to_vec();
        let m = median_round(even, &rule);
        assert_eq!(m.iops, 100.0);
        assert!(m.converged, "±{:.1}%", 100.0 * m.rel_ci);
        let one = round(7.0, 3.0);
        assert_eq!(median_round(vec![one], &rule), one);
    }

    #[test]
    fn the_plan_holds_cost_datasheet_and_held_out_points() {
        let plan = fixed_plan(true);
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
            fixed_plan(false).len(),
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
            for (bs, random, qd) in [
                (LARGE, false, COST_QD_LARGE),
                (SMALL, false, COST_QD_SMALL),
                (SMALL, true, COST_QD_SMALL),
            ] {
                let rate = fit::iops_at_qd(cost_s(bs), alone_s, qd);
                rows.push(row(workload(d, bs, random), qd, rate));
            }
            for (bs, random) in UNLOADED {
                rows.push(row(workload(d, bs, random), 1, 1.0 / alone_s));
            }
        }
        let read = cost_points(&rows, 100).expect("read points");
        let write = cost_points(&rows, 0).expect("write points");
        let cost = fit::cost_model(&read, Some(&write));
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
