//! A tune sweep's outputs: result.json, report.md with the points, the
//! solutions as `[qos.NAME]` snippets and as the kernel's `io.cost.qos`
//! lines, and a plot of bandwidth and latency against vrate.

use std::fmt::Write as _;
use std::path::Path;

use crate::cgroup::Line;
use crate::iocost::{Centi, Ctrl, DevNum, ModelLine, ModelParams, QosLine, QosParams};
use crate::report::slug;
use crate::solve::solution_point;
use crate::tune_point::{Solution, TunePoint, TuneResult};

/// The points as a markdown table (served: with the vrate the server held
/// and its CPU per IO, and the untuned run first).
fn points_table(r: &TuneResult) -> String {
    let mut md = String::from(
        "| vrate % (or cap) | held % | budget IOPS | adversary IOPS | MB/s | probe p50 us | probe p99 us | isolation (p99 / solo) | server CPU us/IO |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".into(), |v| format!("{v:.prec$}"));
    for p in r.untuned.iter().chain(&r.depths).chain(&r.points) {
        let (mut vrate, budget) = match p.light_depth {
            Some(n) => (format!("light_depth {n}"), "-".into()),
            None if p.vrate > 0.0 => (format!("{:.0}", p.vrate), format!("{:.0}", p.budget_iops)),
            None => ("untuned".into(), "-".into()),
        };
        if p.runs > 1 {
            let _ = write!(vrate, " (worst of {})", p.runs);
        }
        let _ = writeln!(
            md,
            "| {vrate} | {} | {budget} | {:.0} | {:.1} | {:.0} | {:.0} | {:.2} | {} |",
            opt(p.vrate_held, 0),
            p.adversary.rate,
            p.adversary.bytes_per_s / 1e6,
            p.probe.p50_us,
            p.probe.p99_us,
            p.isolation,
            opt(p.cpu_us_per_io, 1),
        );
    }
    if let (Some(u), Some(iso)) = (
        &r.untuned,
        r.solutions.iter().find(|s| s.name == "isolation"),
    ) {
        if let Some(p) = solution_point(&r.points, &r.depths, iso) {
            let _ = writeln!(
                md,
                "\nThe isolation solution's point: adversary {:.1}% of untuned, probe p99 {:.0} us (target {:.0} us).",
                100.0 * p.adversary.rate / u.adversary.rate.max(1e-9),
                p.probe.p99_us,
                iso.probe_target_us.unwrap_or(f64::NAN),
            );
        }
    }
    md
}

/// The `[qos.NAME]` of a solution: `min` = `max` = its vrate, or its
/// `light_depth`.
pub fn qos_snippet(device: &str, s: &Solution) -> String {
    let (what, holds, table) = match s.light_depth {
        Some(n) => (
            format!("light_depth {n}"),
            format!("holds other tenants' IOs at the device to {n} beside a light one"),
            format!("[qos.{device}]\nlight_depth = {n}\n"),
        ),
        None => (
            format!("vrate {:.0}%", s.vrate),
            format!("holds vrate at {:.0}%", s.vrate),
            format!(
                "[qos.{device}]\nmin = {:.1}\nmax = {:.1}\n",
                s.vrate, s.vrate
            ),
        ),
    };
    let mut t = format!("# {} solution ({what})\n", s.name);
    let p99 = s.probe_p99_us.unwrap_or(f64::NAN);
    let _ = match s.probe_target_us {
        Some(target) => {
            let verdict = if p99 <= target {
                "within"
            } else {
                "over (no point met it; this is the lowest vrate tried)"
            };
            writeln!(
                t,
                "# {holds}, where the QD 1 probe's p99 was {p99:.0} us, {verdict}\n\
                 # its target {target:.0} us"
            )
        }
        None => writeln!(
            t,
            "# {holds} (the QD 1 probe's p99 at the nearest point: {p99:.0} us)"
        ),
    };
    t.push_str(&table);
    t
}

/// A solution as the kernel's `io.cost.qos` line: vrate held at the
/// solution's (`min` = `max`; a cap solution's isolation vrate, iocost
/// having no caps) and no latency target (`rpct` = `wpct` = 0), as tune
/// measured the device at held vrates only; `rlat` and `wlat` record the
/// QD 1 probe's p99 target (or its p99 there), which a `pct` of 0 leaves
/// unenforced.
pub fn kernel_qos(r: &TuneResult, s: &Solution) -> QosLine {
    let vrate = match s.light_depth {
        Some(_) => s.kernel_vrate.unwrap_or(100.0),
        None => s.vrate,
    };
    let held = Centi::of_percent(vrate).clamp(crate::iocost::VRATE_MIN, crate::iocost::VRATE_MAX);
    let lat = s
        .probe_target_us
        .or(s.probe_p99_us)
        .unwrap_or(r.solo.p99_us);
    let lat = lat.round().clamp(1.0, f64::from(u32::MAX)) as u32;
    QosLine {
        dev: r.line_dev.as_ref().map_or(DevNum::PLACEHOLDER, |l| l.dev),
        enable: true,
        ctrl: Ctrl::User,
        params: QosParams {
            rpct: Centi(0),
            rlat: lat,
            wpct: Centi(0),
            wlat: lat,
            min: held,
            max: held,
        },
    }
}

/// The lines `--apply` writes: the cost model the sweep used, then the
/// QoS of the solution named `solution`.
pub fn kernel_lines(r: &TuneResult, solution: &str) -> Result<Vec<Line>, String> {
    let s = r
        .solutions
        .iter()
        .find(|s| s.name == solution)
        .ok_or_else(|| {
            let names: Vec<&str> = r.solutions.iter().map(|s| s.name.as_str()).collect();
            format!(
                "no solution `{solution}` (the sweep named: {})",
                names.join(", ")
            )
        })?;
    let model = ModelLine {
        dev: r.line_dev.as_ref().map_or(DevNum::PLACEHOLDER, |l| l.dev),
        ctrl: Ctrl::User,
        params: ModelParams::of(&r.cost),
    };
    Ok(vec![Line::Model(model), Line::Qos(kernel_qos(r, s))])
}

/// The solutions as `io.cost.qos` lines, for report.md.
fn kernel_section(r: &TuneResult, solution: &str) -> String {
    let mut md = String::from("## Linux iocost\n\nEach solution as the kernel's `io.cost.qos` takes it. Tune measured the device at held vrates, so each line holds vrate at its solution (`min` = `max`) with no latency target (`rpct` = `wpct` = 0; `rlat` and `wlat` record the QD 1 probe's p99 target, or its p99 at that vrate, and are not enforced at 0%). iocost has no cap on the IOs at the device: a `light_depth` solution's line holds the vrate that isolated instead.\n\n| solution | io.cost.qos |\n|---|---|\n");
    for s in &r.solutions {
        let _ = writeln!(md, "| {} | `{}` |", s.name, kernel_qos(r, s));
    }
    let how = r
        .line_dev
        .as_ref()
        .map_or("not recorded", |l| l.how.as_str());
    let _ = writeln!(
        md,
        "\nMAJ:MIN: {how}. Beside this report, `io.cost.qos` holds the {solution} solution's line and `io.cost.model` the cost model the sweep used:\n\n```text\n{}\n```\n",
        ModelLine {
            dev: r.line_dev.as_ref().map_or(DevNum::PLACEHOLDER, |l| l.dev),
            ctrl: Ctrl::User,
            params: ModelParams::of(&r.cost),
        }
    );
    md
}

/// The kernel's two files for `solution`, beside the report (none if the
/// sweep named no such solution: the report says so).
fn write_kernel_files(out: &Path, r: &TuneResult, solution: &str) -> Result<String, String> {
    let lines = match kernel_lines(r, solution) {
        Ok(l) => l,
        Err(e) => {
            return Ok(format!(
                "(io.cost.model and io.cost.qos not written: {e})\n"
            ))
        }
    };
    for l in &lines {
        let (file, text) = match l {
            Line::Model(m) => ("io.cost.model", m.to_string()),
            Line::Qos(q) => ("io.cost.qos", q.to_string()),
        };
        let path = out.join(file);
        std::fs::write(&path, format!("{text}\n"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(kernel_section(r, solution))
}

pub(crate) fn write(out: &Path, r: &TuneResult, solution: &str) -> Result<(), String> {
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    std::fs::write(out.join("result.json"), json).map_err(|e| e.to_string())?;
    let name = slug(&r.device);
    let mut md = format!(
        "# iopace tune: {}\n\nCommand: `{}`\n\nMeasured {}. Solo QD 1 probe: p50 {:.0} us, p99 {:.0} us. Tuned in {:.1} s.\n\n",
        r.device,
        r.command,
        if r.path.is_empty() { "in process" } else { &r.path },
        r.solo.p50_us,
        r.solo.p99_us,
        r.elapsed_s
    );
    md.push_str(&points_table(r));
    md.push_str("\n![bandwidth and latency against vrate](tune.png)\n\n## Solutions\n\n");
    for s in &r.solutions {
        let _ = writeln!(md, "```toml\n{}```\n", qos_snippet(&name, s));
    }
    md.push_str(&write_kernel_files(out, r, solution)?);
    let by_vrate = |f: &dyn Fn(&TunePoint) -> f64| {
        r.points.iter().map(|p| (p.vrate, f(p))).collect::<Vec<_>>()
    };
    let top = [bench::plot::Series {
        label: "adversary MB/s".into(),
        points: by_vrate(&|p| p.adversary.bytes_per_s / 1e6),
    }];
    let bottom = [
        bench::plot::Series {
            label: "probe p50".into(),
            points: by_vrate(&|p| p.probe.p50_us),
        },
        bench::plot::Series {
            label: "probe p99".into(),
            points: by_vrate(&|p| p.probe.p99_us),
        },
    ];
    let title = format!("{}: bandwidth and QD 1 latency against vrate", r.device);
    if let Err(e) = bench::plot::two_panel_chart(
        &out.join("tune.png"),
        &title,
        "vrate %",
        ("MB/s", &top),
        ("latency (us)", &bottom),
        false,
    ) {
        let _ = writeln!(md, "(plot not written: {e})");
    }
    std::fs::write(out.join("report.md"), md).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::JobStats;
    use crate::solve::{
        depths_done, done_early, isolating_depth, isolation_point, on_line, solutions,
    };
    use crate::tune_point::test_point as point;

    #[test]
    fn isolation_takes_the_isolating_point_with_most_bandwidth() {
        // docs/evidence.md#probe-tune-disk's sweep of this disk: every point isolates, the
        // plateau is noisy and the disk dipped at 100-115%. The knee is
        // 110%; the isolation solution was capped there (max 109.7%), below
        // the 35.9k IOPS measured at 160% within the target.
        let pts: Vec<TunePoint> = [
            (200.0, 31313.0, 1.62),
            (160.0, 35876.0, 1.05),
            (130.0, 33950.0, 1.01),
            (115.0, 20510.0, 1.17),
            (100.0, 22257.0, 1.00),
            (90.0, 25322.0, 1.00),
            (80.0, 23157.0, 0.81),
        ]
        .into_iter()
        .map(|(v, r, i)| point(v, r, i))
        .collect();
        assert_eq!(isolation_point(&pts, 2.0), Some(160.0));
        let solo = pts[0].probe;
        let iso = &solutions(&pts, &[], solo, 2.0)[1];
        // Held at 160%.
        assert_eq!(iso.vrate, 160.0);
        assert!(qos_snippet("disk", iso).contains("min = 160.0\nmax = 160.0\n"));
        // With a tighter target 200% no longer isolates; 160% still does.
        assert_eq!(isolation_point(&pts, 1.5), Some(160.0));
        // A dip: the higher isolating vrate moved less; the lower one wins.
        let dip = [point(130.0, 20000.0, 1.0), point(100.0, 29000.0, 1.0)];
        assert_eq!(isolation_point(&dip, 2.0), Some(100.0));
        // Nothing isolates: the lowest vrate.
        let none = [point(100.0, 29000.0, 5.0), point(60.0, 17000.0, 3.0)];
        assert_eq!(isolation_point(&none, 2.0), Some(60.0));
        // (isolation is p99 over a solo p99 of 100 us here)
        let s = solutions(&none, &[], point(1.0, 1.0, 1.0).probe, 2.0);
        assert_eq!(s[1].vrate, 60.0);
        // Said so, not claimed to isolate.
        assert!(qos_snippet("disk", &s[1]).contains("300 us, over (no point met it"));
        assert_eq!(isolation_point(&[], 2.0), None);
    }

    #[test]
    fn solutions_order_isolation_below_bandwidth() {
        let stats = |rate: f64, p99: f64| JobStats {
            rate,
            bytes_per_s: rate * 4096.0,
            p50_us: p99 / 2.0,
            p99_us: p99,
        };
        let solo = stats(1000.0, 100.0);
        let points: Vec<TunePoint> = [
            (200.0, 1000.0, 900.0),
            (100.0, 1000.0, 800.0),
            (80.0, 800.0, 300.0),
            (60.0, 600.0, 150.0),
            (40.0, 400.0, 120.0),
        ]
        .into_iter()
        .map(|(v, rate, p99)| TunePoint {
            vrate: v,
            budget_iops: v * 10.0,
            adversary: stats(rate, 1.0),
            probe: stats(1.0, p99),
            isolation: p99 / 100.0,
            vrate_held: None,
            cpu_us_per_io: None,
            served: false,
            light_depth: None,
            runs: 1,
        })
        .collect();
        let s = solutions(&points, &[], solo, 2.0);
        assert_eq!(s[0].name, "bandwidth");
        assert!((s[0].vrate - 100.0).abs() < 1e-6);
        assert_eq!(s[1].vrate, 60.0);
        // The probe's target is reported; vrate is held at 60%, with no
        // latency target for the loop (it would be every read's p99).
        assert_eq!(s[1].probe_target_us, Some(200.0));
        assert_eq!(s[1].probe_p99_us, Some(150.0));
        assert_eq!(s[2].vrate, 80.0);
        assert!(done_early(&points[..5], 2.0));
        // Served, the probe's IOs take from the device's budget: a point
        // whose adversary alone is under 90% of it is on the line with them.
        let mut p = points[4];
        p.adversary.rate = 0.8 * p.budget_iops;
        p.probe.rate = 0.15 * p.budget_iops;
        assert!(!on_line(&p));
        p.served = true;
        assert!(on_line(&p) && (p.budgeted_rate() - 0.95 * p.budget_iops).abs() < 1e-9);
        assert!(!done_early(&points[..3], 2.0));
        let q = qos_snippet("disk", &s[1]);
        assert!(
            q.contains("[qos.disk]\nmin = 60.0\nmax = 60.0\n") && q.contains("150 us, within"),
            "{q}"
        );
        assert!(!q.contains("rlat_us") && !q.contains("period_ms"), "{q}");
        assert!(q.contains("its target 200 us"), "{q}");
        // The snippet is a valid [qos] the server takes.
        let t: toml::Table = toml::from_str(&q).expect("toml");
        let qos: pace::pacer::QosConfig = t["qos"]["disk"].clone().try_into().expect("qos");
        assert!(qos.validate().is_ok());
        for s in &s {
            let t: toml::Table = toml::from_str(&qos_snippet("disk", s)).expect("toml");
            let qos: pace::pacer::QosConfig = t["qos"]["disk"].clone().try_into().expect("qos");
            assert!(qos.validate().is_ok() && qos.min == s.vrate && qos.max == s.vrate);
        }
    }

    #[test]
    fn isolation_is_the_cheapest_of_the_vrates_and_caps_that_isolate() {
        let depth = |n: u32, rate: f64, isolation: f64| TunePoint {
            vrate: 0.0,
            budget_iops: 0.0,
            light_depth: Some(n),
            ..point(1.0, rate, isolation)
        };
        // The budget isolates only at 30% (8k IOPS); caps of 16 and 8 do
        // at 60k and 45k: the cap of 16 is the solution.
        let pts = [
            point(100.0, 29000.0, 5.0),
            point(60.0, 17000.0, 3.0),
            point(30.0, 8000.0, 1.5),
        ];
        let caps = [
            depth(32, 80000.0, 4.0),
            depth(16, 60000.0, 1.9),
            depth(8, 45000.0, 1.4),
        ];
        assert!(!depths_done(&caps[..2], 2.0) && depths_done(&caps, 2.0));
        assert_eq!(
            isolating_depth(&caps, 2.0).and_then(|p| p.light_depth),
            Some(16)
        );
        let solo = point(1.0, 1.0, 1.0).probe;
        let s = solutions(&pts, &caps, solo, 2.0);
        assert_eq!((s[1].light_depth, s[1].vrate), (Some(16), 0.0));
        assert_eq!(s[1].probe_p99_us, Some(190.0));
        assert_eq!(s[0].light_depth, None, "bandwidth stays a vrate");
        let q = qos_snippet("disk", &s[1]);
        assert!(
            q.contains("[qos.disk]\nlight_depth = 16\n") && !q.contains("min ="),
            "{q}"
        );
        assert!(q.contains("190 us, within"), "{q}");
        let t: toml::Table = toml::from_str(&q).expect("toml");
        let qos: pace::pacer::QosConfig = t["qos"]["disk"].clone().try_into().expect("qos");
        assert!(qos.validate().is_ok() && qos.light_depth == Some(16) && !qos.budget());
        // A vrate that isolates with more bandwidth than any cap wins.
        let rich = [point(100.0, 70000.0, 1.5)];
        let s = solutions(&rich, &caps, solo, 2.0);
        assert_eq!((s[1].light_depth, s[1].vrate), (None, 100.0));
        // A cap isolating above one that does not is not taken.
        let lucky = [
            depth(16, 60000.0, 1.9),
            depth(12, 55000.0, 2.1),
            depth(8, 45000.0, 1.4),
        ];
        assert_eq!(
            isolating_depth(&lucky, 2.0).and_then(|p| p.light_depth),
            Some(8)
        );
        // No cap isolates: the vrate solution as before.
        let s = solutions(&pts, &caps[..1], solo, 2.0);
        assert_eq!((s[1].light_depth, s[1].vrate), (None, 30.0));
    }

    #[test]
    fn solutions_become_kernel_qos_lines_that_round_trip() {
        let caps = [TunePoint {
            vrate: 0.0,
            budget_iops: 0.0,
            light_depth: Some(16),
            ..point(1.0, 60000.0, 1.9)
        }];
        let pts = [point(100.0, 29000.0, 5.0), point(60.0, 17000.0, 1.5)];
        let solo = point(1.0, 1.0, 1.0).probe;
        let r = TuneResult {
            device: "disk".into(),
            line_dev: Some(crate::cgroup::LineDev::given(DevNum { major: 8, minor: 0 })),
            identity: None,
            cost: pace::pacer::CostModel::nvme(),
            solo,
            points: pts.to_vec(),
            solutions: solutions(&pts, &caps, solo, 2.0),
            elapsed_s: 1.0,
            command: "t".into(),
            path: String::new(),
            untuned: None,
            depths: caps.to_vec(),
        };
        let iso = &r.solutions[1];
        assert_eq!((iso.light_depth, iso.kernel_vrate), (Some(16), Some(60.0)));
        let q = kernel_qos(&r, iso);
        // The cap's vrate stand-in, held; the probe's target (2 x 100 us) recorded.
        assert_eq!(
            q.to_string(),
            "8:0 enable=1 ctrl=user rpct=0.00 rlat=200 wpct=0.00 wlat=200 min=60.00 max=60.00"
        );
        assert_eq!(q.to_string().parse::<QosLine>(), Ok(q));
        let lines = kernel_lines(&r, "bandwidth").expect("lines");
        assert!(matches!(&lines[..], [Line::Model(m), Line::Qos(_)] if m.dev.major == 8));
        let e = kernel_lines(&r, "nosuch").expect_err("no such solution");
        assert!(e.contains("isolation"), "{e}");
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &r, "isolation").expect("written");
        let qos = std::fs::read_to_string(dir.path().join("io.cost.qos")).expect("qos");
        assert_eq!(qos, format!("{q}\n"));
        let md = std::fs::read_to_string(dir.path().join("report.md")).expect("md");
        assert!(
            md.contains("## Linux iocost") && md.contains(&q.to_string()),
            "{md}"
        );
    }
}
