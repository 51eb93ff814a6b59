//! A probe's outputs: result.json, report.md with PNG plots, and a
//! `[cost.NAME]` snippet per device for the config.

use std::fmt::Write as _;
use std::path::Path;

use bench::plot::{line_chart, two_panel_chart, Series};
use pace::pacer::CostModel;

use crate::driver::RateBasis;
use crate::{DeviceResult, ProbeResult};

/// A name usable in file names and as a TOML key.
pub fn slug(name: &str) -> String {
    let s: String = name
        .trim_start_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if s.is_empty() {
        "device".into()
    } else {
        s
    }
}

/// The `[cost.NAME]` table for a config, rounded to whole numbers.
pub fn cost_snippet(name: &str, c: &CostModel) -> String {
    format!(
        "[cost.{name}]\nrbps = {:.0}\nrseqiops = {:.0}\nrrandiops = {:.0}\nwbps = {:.0}\nwseqiops = {:.0}\nwrandiops = {:.0}\n",
        c.rbps, c.rseqiops, c.rrandiops, c.wbps, c.wseqiops, c.wrandiops
    )
}

/// One line per device for the terminal: its cost model and knee.
pub fn summary(d: &DeviceResult) -> String {
    let knee = d
        .curves
        .first()
        .and_then(|c| c.knee_qd)
        .map_or("-".into(), |k| k.to_string());
    format!(
        "{}\n{}knee (4KiB random read): QD {knee}\nio.cost.model: {}",
        d.name,
        cost_snippet(&slug(&d.name), &d.cost),
        crate::model_line(d)
    )
}

fn io(e: std::io::Error, path: &Path) -> String {
    format!("{}: {e}", path.display())
}

pub fn write(out: &Path, r: &ProbeResult) -> Result<(), String> {
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    let path = out.join("result.json");
    std::fs::write(&path, json).map_err(|e| io(e, &path))?;
    let mut md = format!(
        "# iopace probe\n\nCommand: `{}`\n\nMachine: {}\n\n",
        r.command, r.machine
    );
    for d in &r.devices {
        let snippet = cost_snippet(&slug(&d.name), &d.cost);
        let path = out.join(format!("cost-{}.toml", slug(&d.name)));
        std::fs::write(&path, &snippet).map_err(|e| io(e, &path))?;
        device_section(&mut md, d, &snippet);
        let warnings = plots(out, d);
        for w in &warnings {
            let _ = writeln!(md, "(plot not written: {w})\n");
        }
    }
    let lines: String = r
        .devices
        .iter()
        .map(|d| format!("{}\n", crate::model_line(d)))
        .collect();
    let path = out.join("io.cost.model");
    std::fs::write(&path, lines).map_err(|e| io(e, &path))?;
    if let Some(m) = &r.multi {
        let _ = writeln!(
            md,
            "## All devices at once\n\n4 KiB random reads on {}, each at the QD of its cost point: {:.0} IOPS together \
             against {:.0} IOPS as the sum of each alone ({:.0}%).\n",
            m.devices.join(", "),
            m.together.iops,
            m.sum_alone_iops,
            100.0 * m.together.iops / m.sum_alone_iops.max(1e-9)
        );
    }
    let path = out.join("report.md");
    std::fs::write(&path, md).map_err(|e| io(e, &path))
}

fn device_section(md: &mut String, d: &DeviceResult, snippet: &str) {
    let id = &d.identity;
    let _ = writeln!(
        md,
        "## {}\n\n| identity | |\n|---|---|\n| model | {} |\n| firmware | {} |\n| serial (FNV-1a) | {} |\n\
         | kind | {} |\n| size | {} bytes |\n| logical / physical block | {} / {} |\n| rotational | {} |\n\
         | max_sectors_kb / max_hw_sectors_kb | {} / {} |\n| nr_requests, scheduler | {}, {} |\n\n\
         Probed in {:.1} s.\n",
        d.name, id.model, id.firmware, id.serial_hash, id.kind, id.size, id.logical_block,
        id.physical_block, id.rotational, id.max_sectors_kb, id.max_hw_sectors_kb,
        id.nr_requests, id.scheduler, d.elapsed_s
    );
    if let Some(why) = &d.write_refusal {
        let _ = writeln!(
            md,
            "Writes not measured: {why}. The write parameters repeat the read ones.\n"
        );
    }
    cost_section(md, d, snippet);
    curves_section(md, d);
    predictions_section(md, d);
    if let Some(rows) = &d.spec {
        md.push_str(
            "### % of spec\n\n| metric | rated | measured | % of spec |\n|---|---|---|---|\n",
        );
        for r in rows {
            let m = r.measured.map_or("-".into(), |m| format!("{m:.0}"));
            let p = r.percent.map_or("-".into(), |p| format!("{p:.0}%"));
            let _ = writeln!(md, "| {} | {:.0} | {m} | {p} |", r.metric, r.rated);
        }
        md.push('\n');
    }
}

/// The alternated points, each with its rounds, and the `[cost.NAME]`.
fn cost_section(md: &mut String, d: &DeviceResult, snippet: &str) {
    let basis = match d.cost_points.first().map(|r| r.3.basis) {
        Some(RateBasis::QdOverMedian) => "IOPS is QD over the median latency (a timer-paced device: the probe's own scheduling left out); the window rate (median of the windows) and the mean latency show how far the probe was disturbed.",
        _ => "IOPS is completions a second; the window rate is the median of the windows.",
    };
    let _ = writeln!(
        md,
        "### Cost model\n\nThe cost model in {:.1} s ({:.1} s of peak searches). Each point below ran {} round(s), in turn with the others (the rounds stop once every cost point's rounds agree within ±3%, but for one round off by itself, or at their most): its IOPS is the median round, its latencies the median round's, its ±95% CI that of the round rates' mean (with one round, of its windows'). {basis}\n",
        d.cost_s,
        d.phases.search_s,
        d.round_iops.first().map_or(1, |r| r.1.len())
    );
    md.push_str("| point | QD | IOPS | window IOPS | MB/s | p50 us | mean us | p99 us | ±95% CI | converged | s | IOPS of each round | spread |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (label, _, qd, m) in &d.cost_points {
        let rounds = d
            .round_iops
            .iter()
            .find(|r| &r.0 == label)
            .map(|r| r.1.as_slice());
        let rounds = rounds.unwrap_or_default();
        let (lo, hi) = rounds
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        let each: Vec<String> = rounds.iter().map(|x| format!("{x:.0}")).collect();
        let _ = writeln!(
            md,
            "| {label} | {qd} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1}% | {} | {:.1} | {} | {:.1}% |",
            m.iops, m.window_iops, m.bytes_per_s / 1e6, m.p50_us, m.mean_us, m.p99_us, 100.0 * m.rel_ci,
            if m.converged { "yes" } else { "no (capped)" }, m.secs, each.join(" / "),
            if rounds.is_empty() { 0.0 } else { 100.0 * (hi / lo - 1.0) }
        );
    }
    let _ = writeln!(md, "\n```toml\n{snippet}```\n");
    search_section(md, d);
    iocost_section(md, d);
}

/// Each cost point's search for its peak QD.
fn search_section(md: &mut String, d: &DeviceResult) {
    if d.qd_search.is_empty() {
        return;
    }
    md.push_str("### Peak QD of each cost point\n\nEach cost point above ran at the QD where its rate peaks: a search climbed QD 1, 2, 4, ... until two doublings rose less than 3% or one fell a quarter under the best, tried 3/4 and 3/2 of the best QD, and took the middle QD of those within 3% of the best.\n\n| point | QD taken | QD: IOPS tried |\n|---|---|---|\n");
    for t in &d.qd_search {
        let tried: Vec<String> = t
            .tried
            .iter()
            .map(|(q, i)| format!("{q}: {i:.0}"))
            .collect();
        let _ = writeln!(md, "| {} | {} | {} |", t.label, t.qd, tried.join(", "));
    }
    md.push('\n');
}

/// The device's `io.cost.model` line for Linux's iocost.
fn iocost_section(md: &mut String, d: &DeviceResult) {
    let line = crate::model_line(d);
    let how = d
        .line_dev
        .as_ref()
        .map_or("not recorded", |l| l.how.as_str());
    let _ = writeln!(
        md,
        "### Linux iocost\n\nThe cost model as the kernel's `io.cost.model` takes it (also in `io.cost.model` beside this report; write it into the root of the cgroup2 hierarchy, or give `--apply`):\n\n```text\n{line}\n```\n\nMAJ:MIN {}: {how}.\n",
        line.dev
    );
}

fn predictions_section(md: &mut String, d: &DeviceResult) {
    if !d.predictions.is_empty() {
        md.push_str("### Held-out mixes\n\nNot used by the fit. `linear`: one over the mean device time of an IO under the cost model as measured (its points at their QD). `capacity`: the same with each cost point taken to saturation by its latency alone (QD 1). `predicted`: at the mix's QD, an IO waiting for the QD - 1 ahead of it, QD / (latency alone + (QD - 1) / capacity); `bound` is the share of the capacity that QD reaches (latency-bound below 90%).\n\n| workload | QD | linear | capacity | latency alone us | bound | predicted IOPS | measured IOPS | error |\n|---|---|---|---|---|---|---|---|---|\n");
    }
    for p in &d.predictions {
        let err = 100.0 * (p.measured.iops / p.predicted_iops - 1.0);
        let sizes: Vec<String> = p
            .workload
            .sizes()
            .iter()
            .map(|b| format!("{}KiB", b >> 10))
            .collect();
        let share = if p.capacity_iops > 0.0 {
            p.predicted_iops / p.capacity_iops
        } else {
            1.0
        };
        let bound = if share < 0.9 { "latency" } else { "capacity" };
        let _ = writeln!(
            md,
            "| random, {}% reads, {} | {} | {:.0} | {:.0} | {:.0} | {bound} ({:.0}%) | {:.0} | {:.0} | {err:+.1}% |",
            p.workload.read_pct,
            sizes.join("/"),
            p.qd,
            p.linear_iops,
            p.capacity_iops,
            p.unloaded_us,
            100.0 * share,
            p.predicted_iops,
            p.measured.iops
        );
    }
    md.push('\n');
}

fn curves_section(md: &mut String, d: &DeviceResult) {
    let slug = slug(&d.name);
    let _ = writeln!(
        md,
        "### IOPS and latency against queue depth\n\nIn {:.1} s; {} point(s) of these curves and the scaling below were measured by the peak searches (three windows, `s` about 0.3) and are not measured again.\n",
        d.phases.curves_s, d.phases.reused
    );
    for c in &d.curves {
        let knee = c.knee_qd.map_or("-".into(), |k| k.to_string());
        let _ = writeln!(md, "**{}** (knee: QD {knee})\n\n| QD | IOPS | window IOPS | MB/s | p50 us | p99 us | ±95% CI | s |\n|---|---|---|---|---|---|---|---|", c.label);
        for p in &c.points {
            let m = &p.m;
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.1}% | {:.1} |",
                p.x,
                m.iops,
                m.window_iops,
                m.bytes_per_s / 1e6,
                m.p50_us,
                m.p99_us,
                100.0 * m.rel_ci,
                m.secs
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "![QD curves]({slug}-qd.png)\n\n### Scaling over threads (total QD {})\n\n| threads | IOPS | p99 us |\n|---|---|---|", crate::plan::COST_QD_SMALL);
    for p in &d.thread_scaling {
        let _ = writeln!(md, "| {} | {:.0} | {:.0} |", p.x, p.m.iops, p.m.p99_us);
    }
    let _ = writeln!(md, "\n![threads]({slug}-threads.png)\n");
}

/// The QD and thread plots; returns why any was not written.
fn plots(out: &Path, d: &DeviceResult) -> Vec<String> {
    let slug = slug(&d.name);
    let iops: Vec<Series> = d
        .curves
        .iter()
        .map(|c| Series {
            label: c.label.clone(),
            points: c
                .points
                .iter()
                .map(|p| (f64::from(p.x), p.m.iops))
                .collect(),
        })
        .collect();
    let lat: Vec<Series> = d
        .curves
        .iter()
        .flat_map(|c| {
            [("p50", 0), ("p99", 1)].map(|(q, i)| Series {
                label: format!("{} {q}", c.label),
                points: c
                    .points
                    .iter()
                    .map(|p| (f64::from(p.x), if i == 0 { p.m.p50_us } else { p.m.p99_us }))
                    .collect(),
            })
        })
        .collect();
    let threads = [Series {
        label: "4KiB random read".into(),
        points: d
            .thread_scaling
            .iter()
            .map(|p| (f64::from(p.x), p.m.iops))
            .collect(),
    }];
    let title = format!("{}: IOPS and latency against QD", d.name);
    [
        two_panel_chart(
            &out.join(format!("{slug}-qd.png")),
            &title,
            "queue depth",
            ("IOPS", &iops),
            ("latency (us)", &lat),
            true,
        ),
        line_chart(
            &out.join(format!("{slug}-threads.png")),
            &format!("{}: scaling over threads", d.name),
            "threads",
            "IOPS",
            &threads,
            true,
        ),
    ]
    .into_iter()
    .filter_map(Result::err)
    .collect()
}
