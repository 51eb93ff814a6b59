//! The order of a probe: cost points, QD curves, scaling, the held-out mix,
//! then several devices at once.

use std::time::Instant;

use indicatif::ProgressBar;

use pace::pacer::CostModel;

use crate::converge::StopRule;
use crate::driver::{measure, Job, Measurement, Workload};
use crate::fit::{self, CostPoints, SMALL};
use crate::known::Known;
use crate::plan::{self, workload, Fixed, Rounds, Row, COST_QD_SMALL};
use crate::qd_search::{QdSearch, Trace};
use crate::rounds;
use crate::{
    open_targets, report, spec, Curve, DeviceResult, MultiDevice, Options, Phases, Point,
    Prediction, ProbeError, ProbeResult, Target,
};

/// The label of the 4 KiB random read cost point.
const RAND_READ: &str = "rand read 4KiB";

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

/// The highest QD of the curves and the peak searches.
fn max_qd(opts: &Options) -> u32 {
    let max = if opts.quick {
        opts.max_qd.min(64)
    } else {
        opts.max_qd
    };
    max.max(1)
}

fn qds(opts: &Options) -> Vec<u32> {
    (0..=9)
        .map(|i| 1 << i)
        .filter(|q| *q <= max_qd(opts))
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
    let rounds = opts.round_count().min;
    let fixed = plan::fixed_plan(writes, &[]).len() as u64 * u64::from(rounds);
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

/// Measures every point of `plan` once a round, in turn, as many rounds
/// as [`rounds::rounds_done`] asks; each point is the median of its rounds.
/// Returns the rows and every round's IOPS.
fn measure_plan(
    t: &Target,
    plan: &[Fixed],
    opts: &Options,
    bar: &ProgressBar,
) -> Result<(Vec<Row>, Vec<Rounds>), ProbeError> {
    let rule = opts.round_rule();
    let count = opts.round_count();
    // The bar counts the least rounds; each round past those adds its points.
    let least = plan.len() * count.min as usize;
    let mut calls = 0;
    let seen = rounds::rounds_of(plan, &count, |f| {
        if calls >= least {
            bar.inc_length(1);
        }
        calls += 1;
        let label = format!("{}: {}", t.name, f.label);
        point(bar, &single(t, f.qd), &f.w, &rule, &label)
    })?;
    Ok(rounds::rows_of(plan, seen, &rule))
}

/// A search point: three windows, after a warm-up of at most one.
fn search_rule(opts: &Options) -> StopRule {
    let rule = opts.rule();
    StopRule {
        warmup: rule.warmup.min(rule.window),
        min_windows: 3,
        cap: rule.window * 3,
        ..rule
    }
}

/// Each cost point's peak: the QD where its rate is highest, by a short
/// search over QD (`qd_search`) up to the curves' highest QD. Every point
/// it measures is kept in `known`.
fn search_peaks(
    t: &Target,
    points: &[Fixed],
    opts: &Options,
    bar: &ProgressBar,
    known: &mut Known,
) -> Result<Vec<Trace>, ProbeError> {
    let rule = search_rule(opts);
    peaks_of(&t.name, points, max_qd(opts), |f, qd| {
        bar.inc_length(1);
        let label = format!("{}: {} QD {qd} (peak search)", t.name, f.label);
        let m = point(bar, &single(t, qd), &f.w, &rule, &label)?;
        known.add(f.w, qd, m);
        Ok(m.iops)
    })
}

/// Each point's search up to `max_qd` on device `name`, `rate` measuring
/// a point at a QD (the device in [`search_peaks`], a model in virtual
/// time in tests).
pub(crate) fn peaks_of(
    name: &str,
    points: &[Fixed],
    max_qd: u32,
    mut rate: impl FnMut(&Fixed, u32) -> Result<f64, ProbeError>,
) -> Result<Vec<Trace>, ProbeError> {
    let mut traces = Vec::new();
    for f in points {
        let mut s = QdSearch::new(max_qd);
        while let Some(qd) = s.next() {
            s.record(qd, rate(f, qd)?);
        }
        let qd = s
            .peak()
            .ok_or_else(|| ProbeError::Run(format!("{name}: {}: no QD measured", f.label)))?;
        traces.push(Trace {
            label: f.label.clone(),
            tried: s.seen().to_vec(),
            qd,
        });
    }
    Ok(traces)
}

/// The read cost points alone, each at its peak, measured now (for `tune`
/// without a cost model).
pub(crate) fn read_cost_points(t: &Target, opts: &Options) -> Result<CostPoints, ProbeError> {
    let bar = ProgressBar::hidden();
    let points = plan::cost_plan(100);
    let peaks = search_peaks(t, &points, opts, &bar, &mut Known::new())?;
    let plan: Vec<Fixed> = points
        .into_iter()
        .zip(&peaks)
        .map(|(f, p)| Fixed { qd: p.qd, ..f })
        .collect();
    let (rows, _) = measure_plan(t, &plan, opts, &bar)?;
    plan::cost_points(&rows, 100)
        .map(|p| p.0)
        .ok_or_else(|| ProbeError::Run("read cost points missing".into()))
}

/// What the cost phase measured: its rows and rounds, each cost point's
/// search, the cost model and the held-out predictions; and its time
/// (the search's and the rounds' of `phases`).
struct CostPhase {
    rows: Vec<Row>,
    rounds: Vec<Rounds>,
    peaks: Vec<Trace>,
    cost: CostModel,
    predictions: Vec<Prediction>,
    phases: Phases,
}

/// Each cost point's peak QD, then every fixed point in rounds, each cost
/// point at its peak; the cost model of the rows.
fn cost_phase(
    t: &Target,
    opts: &Options,
    bar: &ProgressBar,
    known: &mut Known,
) -> Result<CostPhase, ProbeError> {
    let writes = t.write_refusal.is_none();
    let start = Instant::now();
    let peaks = search_peaks(t, &plan::cost_points_plan(writes), opts, bar, known)?;
    let search_s = start.elapsed().as_secs_f64();
    let (rows, rounds) = measure_plan(t, &plan::fixed_plan(writes, &peaks), opts, bar)?;
    let phases = Phases {
        search_s,
        rounds_s: start.elapsed().as_secs_f64() - search_s,
        rounds: rounds.first().map_or(0, |r| r.1.len() as u32),
        ..Phases::default()
    };
    let missing = || ProbeError::Run(format!("{}: cost points missing", t.name));
    let (read, write, cost) = cost_of(&rows, writes).ok_or_else(missing)?;
    let predictions = plan::predictions(&rows, &cost, &read, write.as_ref());
    Ok(CostPhase {
        rows,
        rounds,
        peaks,
        cost,
        predictions,
        phases,
    })
}

/// Each direction's cost points out of the rows (writes: if measured)
/// and the cost model they give; none if a point is missing.
#[allow(clippy::type_complexity)]
pub(crate) fn cost_of(
    rows: &[Row],
    writes: bool,
) -> Option<(
    (CostPoints, [u32; 3]),
    Option<(CostPoints, [u32; 3])>,
    CostModel,
)> {
    let read = plan::cost_points(rows, 100)?;
    let write = if writes {
        Some(plan::cost_points(rows, 0)?)
    } else {
        None
    };
    let cost = fit::cost_model(&read.0, write.as_ref().map(|w| &w.0));
    Some((read, write, cost))
}

/// One QD curve: `w` at each QD of the curves, a point `known` taken as
/// it is (counted in `reused`).
fn curve(
    t: &Target,
    label: &str,
    w: Workload,
    opts: &Options,
    bar: &ProgressBar,
    (known, reused): (&mut Known, &mut u32),
) -> Result<Curve, ProbeError> {
    let mut points = Vec::new();
    for qd in qds(opts) {
        let (m, was_known) = known.or_measure(w, qd, || {
            let label = format!("{}: {label} QD {qd}", t.name);
            point(bar, &single(t, qd), &w, &opts.rule(), &label)
        })?;
        if was_known {
            bar.inc(1);
            *reused += 1;
        }
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
    let mut known = Known::new();
    let c = cost_phase(t, opts, bar, &mut known)?;
    let cost_s = start.elapsed().as_secs_f64();
    let mut phases = c.phases;
    let curves = curves(t, writes, opts, bar, (&mut known, &mut phases.reused))?;
    phases.curves_s = start.elapsed().as_secs_f64() - cost_s;
    let thread_scaling = scaling(t, opts, bar, (&mut known, &mut phases.reused))?;
    phases.scaling_s = start.elapsed().as_secs_f64() - cost_s - phases.curves_s;
    Ok(DeviceResult {
        name: t.name.clone(),
        identity: t.identity.clone(),
        cost: c.cost,
        cost_points: c.rows,
        round_iops: c.rounds,
        qd_search: c.peaks,
        write_refusal: t.write_refusal.clone(),
        line_dev: Some(t.line_dev.clone()),
        curves,
        thread_scaling,
        predictions: c.predictions,
        spec: None,
        cost_s,
        elapsed_s: start.elapsed().as_secs_f64(),
        phases,
    })
}

/// 4 KiB random reads at QD 64 over 1, 2, 4, ... threads (one thread: the
/// curve's QD 64 point, if it has one).
fn scaling(
    t: &Target,
    opts: &Options,
    bar: &ProgressBar,
    (known, reused): (&mut Known, &mut u32),
) -> Result<Vec<Point>, ProbeError> {
    let w = workload(100, SMALL, true);
    let mut points = Vec::new();
    for threads in thread_counts(opts) {
        let qd = (COST_QD_SMALL / threads).max(1);
        let jobs: Vec<Job> = (0..threads).map(|_| job(t, qd)).collect();
        let label = format!("{}: 4KiB random read, {threads} threads", t.name);
        let measure = || point(bar, &jobs, &w, &opts.rule(), &label);
        let m = match known.get(&w, qd).filter(|_| threads == 1) {
            Some(m) => {
                bar.inc(1);
                *reused += 1;
                m
            }
            None => measure()?,
        };
        points.push(Point { x: threads, m });
    }
    Ok(points)
}

fn curves(
    t: &Target,
    writes: bool,
    opts: &Options,
    bar: &ProgressBar,
    (known, reused): (&mut Known, &mut u32),
) -> Result<Vec<Curve>, ProbeError> {
    let mut todo = vec![("4KiB random read", workload(100, SMALL, true))];
    if writes {
        todo.push(("4KiB random write", workload(0, SMALL, true)));
    }
    todo.push(("128KiB sequential read", workload(100, 128 << 10, false)));
    todo.into_iter()
        .map(|(label, w)| curve(t, label, w, opts, bar, (&mut *known, &mut *reused)))
        .collect()
}

/// 4 KiB random reads on every device at once, each at the QD of its cost
/// point, against the sum of those points alone.
fn together(
    targets: &[Target],
    devices: &[DeviceResult],
    opts: &Options,
    bar: &ProgressBar,
) -> Result<MultiDevice, ProbeError> {
    bar.inc_length(1);
    let alone: Vec<Option<&Row>> = devices
        .iter()
        .map(|d| d.cost_points.iter().find(|p| p.0 == RAND_READ))
        .collect();
    let jobs: Vec<Job> = targets
        .iter()
        .zip(&alone)
        .map(|(t, r)| job(t, r.map_or(COST_QD_SMALL, |r| r.2)))
        .collect();
    let w = workload(100, SMALL, true);
    let together = point(
        bar,
        &jobs,
        &w,
        &opts.rule(),
        "all devices: 4KiB random read",
    )?;
    let sum_alone_iops = alone.iter().flatten().map(|p| p.3.iops).sum();
    Ok(MultiDevice {
        devices: targets.iter().map(|t| t.name.clone()).collect(),
        sum_alone_iops,
        together,
    })
}

/// The cost model `tune` throttles by: the config's `[cost.NAME]`, else its
/// cost database's entry, else the read cost points measured now.
pub fn cost_for_tune(opts: &Options, t: &Target) -> Result<(CostModel, String), ProbeError> {
    if let Some(path) = &opts.config {
        let loaded = config::Config::load(Some(path))
            .map_err(|e| ProbeError::Usage(format!("config error: {e}")))?;
        let c = &loaded.config;
        if let Some(cost) = c.cost.get(&t.name) {
            return Ok((*cost, format!("[cost.{}] of {}", t.name, path.display())));
        }
        if let Some(db) = &c.cost_db {
            if let Some(cost) = config::cost_db::cost_for(db, &loaded.bdevs, &t.name, &t.bdev) {
                return Ok((cost, format!("the cost database {}", db.display())));
            }
        }
    }
    let read = read_cost_points(t, opts)?;
    Ok((
        fit::cost_model(&read, None),
        "read cost points measured now".into(),
    ))
}

#[cfg(test)]
#[path = "run_model_tests.rs"]
mod model_tests;
