//! The order of a probe: cost points, QD curves, scaling, the held-out mix,
//! then several devices at once.

use std::time::Instant;

use indicatif::ProgressBar;

use crate::driver::{measure, Job, Measurement, Workload};
use crate::fit::{self, CostPoints, LARGE, SMALL};
use crate::{
    open_targets, report, spec, Curve, DeviceResult, MultiDevice, Options, Point, Prediction,
    ProbeError, ProbeResult, Target,
};

/// IOs in flight for the small cost points: past the knee of most devices.
pub const COST_QD_SMALL: u32 = 64;
/// IOs in flight for the large sequential cost points.
pub const COST_QD_LARGE: u32 = 16;

const fn workload(read_pct: u32, bs: u32, random: bool) -> Workload {
    Workload {
        read_pct,
        bs,
        random,
    }
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
        let mut d = device(t, opts, &bar)?;
        d.spec = rated.as_ref().map(|r| spec::compare(r, &d));
        devices.push(d);
    }
    let multi = if targets.len() > 1 {
        Some(together(&targets, &devices, opts, &bar)?)
    } else {
        None
    };
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
    let cost = if writes { 6 } else { 3 };
    let curves = if writes { 3 } else { 2 };
    let mix = u64::from(writes);
    cost + curves * qds(opts).len() as u64 + thread_counts(opts).len() as u64 + mix
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
    opts: &Options,
    label: &str,
) -> Result<Measurement, ProbeError> {
    bar.set_message(label.to_string());
    let m = measure(jobs, w, &opts.rule()).map_err(|e| ProbeError::Run(format!("{label}: {e}")))?;
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

/// One direction's three cost points.
pub(crate) fn cost_points(
    t: &Target,
    read_pct: u32,
    opts: &Options,
    bar: &ProgressBar,
    out: &mut Vec<(String, Workload, u32, Measurement)>,
) -> Result<CostPoints, ProbeError> {
    let dir = if read_pct == 100 { "read" } else { "write" };
    let mut rate = |label: String, w: Workload, qd| {
        let m = point(
            bar,
            &single(t, qd),
            &w,
            opts,
            &format!("{}: {label}", t.name),
        )?;
        out.push((label, w, qd, m));
        Ok::<f64, ProbeError>(m.iops)
    };
    Ok(CostPoints {
        seq_large_iops: rate(
            format!("seq {dir} 1MiB"),
            workload(read_pct, LARGE, false),
            COST_QD_LARGE,
        )?,
        seq_small_iops: rate(
            format!("seq {dir} 4KiB"),
            workload(read_pct, SMALL, false),
            COST_QD_SMALL,
        )?,
        rand_small_iops: rate(
            format!("rand {dir} 4KiB"),
            workload(read_pct, SMALL, true),
            COST_QD_SMALL,
        )?,
    })
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
            opts,
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
    let mut cost_rows = Vec::new();
    // Writes first: they also fill a fresh file, so the reads that follow reach the disk.
    let write = if writes {
        Some(cost_points(t, 0, opts, bar, &mut cost_rows)?)
    } else {
        None
    };
    let read = cost_points(t, 100, opts, bar, &mut cost_rows)?;
    let cost = fit::cost_model(&read, write.as_ref());
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
    let mut thread_scaling = Vec::new();
    for threads in thread_counts(opts) {
        let jobs: Vec<Job> = (0..threads)
            .map(|_| job(t, (COST_QD_SMALL / threads).max(1)))
            .collect();
        let label = format!("{}: 4KiB random read, {threads} threads", t.name);
        let m = point(bar, &jobs, &workload(100, SMALL, true), opts, &label)?;
        thread_scaling.push(Point { x: threads, m });
    }
    let prediction = if writes {
        let w = workload(70, SMALL, true);
        let label = format!("{}: 70/30 random 4KiB", t.name);
        Some(Prediction {
            workload: w,
            qd: COST_QD_SMALL,
            predicted_iops: fit::predicted_iops(&cost, 70, SMALL),
            measured: point(bar, &single(t, COST_QD_SMALL), &w, opts, &label)?,
        })
    } else {
        None
    };
    Ok(DeviceResult {
        name: t.name.clone(),
        identity: t.identity.clone(),
        cost,
        cost_points: cost_rows,
        write_refusal: t.write_refusal.clone(),
        curves,
        thread_scaling,
        prediction,
        spec: None,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
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
    let together = point(bar, &jobs, &w, opts, "all devices: 4KiB random read")?;
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
