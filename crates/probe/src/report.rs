//! A probe's outputs: result.json, report.md with PNG plots, and a
//! `[cost.NAME]` snippet per device for the config.

use std::fmt::Write as _;
use std::path::Path;

use bench::plot::{line_chart, two_panel_chart, Series};
use pace::pacer::CostModel;

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
    if let Some(m) = &r.multi {
        let _ = writeln!(
            md,
            "## All devices at once\n\n4 KiB random reads, QD {} each on {}: {:.0} IOPS together \
             against {:.0} IOPS as the sum of each alone ({:.0}%).\n",
            crate::run::COST_QD_SMALL,
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
    md.push_str("### Cost model\n\nIOPS is QD over the median latency; the window rate (median of the windows) and the mean latency show how far the probe was disturbed.\n\n| point | QD | IOPS | window IOPS | MB/s | p50 us | mean us | p99 us | ±95% CI | converged | s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (label, _, qd, m) in &d.cost_points {
        let _ = writeln!(
            md,
            "| {label} | {qd} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1}% | {} | {:.1} |",
            m.iops, m.window_iops, m.bytes_per_s / 1e6, m.p50_us, m.mean_us, m.p99_us, 100.0 * m.rel_ci,
            if m.converged { "yes" } else { "no (capped)" }, m.secs
        );
    }
    let _ = writeln!(md, "\n```toml\n{snippet}```\n");
    curves_section(md, d);
    if let Some(p) = &d.prediction {
        let err = 100.0 * (p.measured.iops / p.predicted_iops - 1.0);
        let _ = writeln!(
            md,
            "### Held-out mix\n\n4 KiB random, {}% reads, QD {}: the cost model predicts {:.0} IOPS, \
             measured {:.0} ({err:+.1}%).\n",
            p.workload.read_pct, p.qd, p.predicted_iops, p.measured.iops
        );
    }
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

fn curves_section(md: &mut String, d: &DeviceResult) {
    let slug = slug(&d.name);
    md.push_str("### IOPS and latency against queue depth\n\n");
    for c in &d.curves {
        let knee = c.knee_qd.map_or("-".into(), |k| k.to_string());
        let _ = writeln!(md, "**{}** (knee: QD {knee})\n\n| QD | IOPS | window IOPS | MB/s | p50 us | p99 us | ±95% CI |\n|---|---|---|---|---|---|---|", c.label);
        for p in &c.points {
            let m = &p.m;
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.1}% |",
                p.x,
                m.iops,
                m.window_iops,
                m.bytes_per_s / 1e6,
                m.p50_us,
                m.p99_us,
                100.0 * m.rel_ci
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "![QD curves]({slug}-qd.png)\n\n### Scaling over threads (total QD {})\n\n| threads | IOPS | p99 us |\n|---|---|---|", crate::run::COST_QD_SMALL);
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
