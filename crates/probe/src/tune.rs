//! `iopace tune`: a device's latency targets and vrate bounds, found by a
//! QD 1 latency probe beside a saturating reader throttled to vrate points,
//! from high to low with early stopping, and beside the reader held to a
//! number of IOs at the device (`[qos] light_depth`) from high to low; the
//! isolation candidate is run again before it is named. Every point is
//! saved as it ends, so `--resume` skips finished points and an
//! interruption loses nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pace::pacer::CostModel;

use crate::converge::StopRule;
use crate::driver::JobStats;
use crate::measurer::Measurer;
use crate::served::Served;
use crate::solve::{depths_done, done_early, solutions, to_confirm, worst_of};
use crate::tune_point::{budget_iops, Knob, TunePoint};
use crate::tune_store::{check_plan, path_name, saved_or, Plan};
use crate::{ProbeError, Target};

pub use crate::served::ADVERSARY_QD;
pub use crate::tune_point::{Solution, TuneResult, DEPTHS, VRATES};
pub use crate::tune_report::qos_snippet;

/// Extra runs of the isolation candidate before it is named: one 10 s
/// point read the probe's p99 130-400 us under what the bench's runs then
/// measured (docs/evidence.md#tune-disk-alone), so a pick near its target was
/// optimistic.
pub const CONFIRM_RUNS: u32 = 2;

/// Candidates confirmed at most, each failing one handing over to the next.
pub const MAX_CONFIRMED: usize = 3;

/// Points a sweep runs at most, besides solo (and served, untuned): each
/// gets this share of the budget.
pub const MAX_POINTS: usize = DEPTHS.len() + VRATES.len() + CONFIRM_RUNS as usize * MAX_CONFIRMED;

#[derive(Debug, Clone)]
pub struct TuneOptions {
    pub out: PathBuf,
    pub budget: Duration,
    pub resume: bool,
    pub quick: bool,
    /// The isolation solution keeps the probe's p99 within this factor of solo.
    pub isolation_factor: f64,
    pub command: String,
    /// Measure solo and every point through `iopace serve` and fio's nbd
    /// engine (the bench's path) instead of in process.
    pub served: Option<Served>,
    /// The device number its iocost lines name.
    pub line_dev: Option<crate::cgroup::LineDev>,
    /// The device's model and firmware.
    pub identity: Option<bdev::identity::Identity>,
    /// The solution whose `io.cost.qos` line is written beside the report.
    pub kernel_solution: String,
}

/// Runs the sweep on `t` with the cost model `cost`; writes the outputs.
pub fn tune(t: &Target, cost: CostModel, o: &TuneOptions) -> Result<TuneResult, ProbeError> {
    sweep(&t.name, Some(t), cost, o)
}

/// The sweep through `o.served` alone, on the config's bdev `device`: this
/// process holds nothing of the device open, since every `iopace serve` it
/// starts takes a file image's exclusive lock (a `Target` open here kept
/// that lock, and each served run failed with "in use").
pub fn tune_served(
    device: &str,
    cost: CostModel,
    o: &TuneOptions,
) -> Result<TuneResult, ProbeError> {
    if o.served.is_none() {
        return Err(ProbeError::Usage(
            "a served sweep needs a config to serve".into(),
        ));
    }
    sweep(device, None, cost, o)
}

/// The sweep on `device`; `t` is its bdev opened here, needed only in
/// process (served runs read it through the server).
fn sweep(
    device: &str,
    t: Option<&Target>,
    cost: CostModel,
    o: &TuneOptions,
) -> Result<TuneResult, ProbeError> {
    let start = Instant::now();
    let dir = o.out.join("points");
    if !o.resume && dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| ProbeError::Run(format!("{}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| ProbeError::Usage(format!("{}: {e}", dir.display())))?;
    let plan = Plan {
        device: device.to_string(),
        served: o.served.is_some(),
        cost,
    };
    check_plan(&dir, &plan)?;
    let m = Measurer {
        t,
        cost,
        rule: point_rule(o),
        served: o.served.as_ref(),
    };
    let solo: JobStats = saved_or(&dir.join("solo.json"), || m.solo())?;
    let untuned = match m.served {
        Some(_) => Some(m.saved_point(&dir, Knob::Untuned, solo)?),
        None => None,
    };
    let (mut depths, mut points) = sweep_knobs(&m, &dir, solo, o)?;
    confirm_isolation(&m, &dir, &mut points, &mut depths, solo, o)?;
    let result = TuneResult {
        device: device.to_string(),
        line_dev: o.line_dev.clone(),
        identity: o.identity.clone(),
        cost,
        solo,
        solutions: solutions(&points, &depths, solo, o.isolation_factor),
        points,
        depths,
        elapsed_s: start.elapsed().as_secs_f64(),
        command: o.command.clone(),
        path: path_name(m.served.is_some()).into(),
        untuned,
    };
    crate::tune_report::write(&o.out, &result, &o.kernel_solution).map_err(ProbeError::Run)?;
    Ok(result)
}

/// The cap points, highest cap first, then the vrate points, highest
/// first, each sweep stopping early where lower settings only cost bandwidth.
fn sweep_knobs(
    m: &Measurer,
    dir: &Path,
    solo: JobStats,
    o: &TuneOptions,
) -> Result<(Vec<TunePoint>, Vec<TunePoint>), ProbeError> {
    let bar = indicatif::ProgressBar::new((DEPTHS.len() + VRATES.len()) as u64);
    let mut depths: Vec<TunePoint> = Vec::new();
    for n in DEPTHS {
        bar.set_message(format!("light_depth {n}"));
        depths.push(m.saved_point(dir, Knob::Depth(n), solo)?);
        bar.inc(1);
        if depths_done(&depths, o.isolation_factor) {
            break;
        }
    }
    let mut points: Vec<TunePoint> = Vec::new();
    for vrate in VRATES {
        bar.set_message(format!("vrate {vrate}%"));
        let p = m.saved_point(dir, Knob::Vrate(vrate), solo)?;
        points.push(TunePoint {
            budget_iops: budget_iops(m.cost, p.vrate),
            ..p
        });
        bar.inc(1);
        if done_early(&points, o.isolation_factor) {
            break;
        }
    }
    bar.finish_and_clear();
    Ok((depths, points))
}

/// Each point's share of the budget (quick: the quick rule).
fn point_rule(o: &TuneOptions) -> StopRule {
    if o.quick {
        return StopRule::quick();
    }
    let per_point = o.budget / (MAX_POINTS as u32 + 1);
    StopRule {
        cap: per_point.clamp(Duration::from_millis(500), Duration::from_secs(60)),
        ..StopRule::device()
    }
}

/// Measures the isolation candidate `runs` more times and keeps the worst
/// of its runs; if it no longer isolates, the next candidate is confirmed
/// in turn (at most [`MAX_CONFIRMED`]). Each run is saved, so `--resume`
/// repeats none.
fn confirm_isolation(
    m: &Measurer,
    dir: &Path,
    points: &mut [TunePoint],
    depths: &mut [TunePoint],
    solo: JobStats,
    o: &TuneOptions,
) -> Result<(), ProbeError> {
    let runs = if o.quick { 1 } else { CONFIRM_RUNS };
    for _ in 0..MAX_CONFIRMED {
        let Some(knob) = to_confirm(points, depths, solo, o.isolation_factor) else {
            return Ok(());
        };
        let slot = match knob {
            Knob::Depth(_) => depths.iter_mut(),
            _ => points.iter_mut(),
        }
        .find(|p| Knob::of(p) == knob);
        let Some(p) = slot else {
            return Ok(());
        };
        let mut more = Vec::new();
        for i in 1..=runs {
            more.push(m.saved_run(dir, knob, &format!("{}-again{i}", knob.key()), solo)?);
        }
        *p = TunePoint {
            budget_iops: p.budget_iops,
            ..worst_of(*p, &more, solo)
        };
    }
    Ok(())
}
