//! The result tables: per host and total for a run, and sweep tables over
//! the x variable with one block per series (target and other variables).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::check::{export_group_p99, export_groups, fio_disagreements};
use crate::result::RunResult;

/// The mean over repetitions of one point of one series.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SweepRow {
    pub series: String,
    pub x: String,
    pub reps: usize,
    pub total_qd: u32,
    pub kiops: f64,
    pub bw_gbps: f64,
    /// Spread of BW over repetitions (sample standard deviation).
    pub bw_rep_sd_gbps: f64,
    pub wire_gbps: Option<f64>,
    pub avg_lat_us: f64,
    pub p99_us: f64,
    /// From the latency distribution of all IOs (the jobs' percentiles
    /// merged by IO count).
    pub p999_us: f64,
    pub bw_stddev_gbps: f64,
    pub bufs_avg_mib: Option<f64>,
    pub bufs_max_mib: Option<f64>,
    pub sock_queue_mib: Option<f64>,
    pub pacer_period_us: Option<f64>,
    pub cpu_us_per_io: f64,
    /// The worst host's payload BW as a share of its own link (shaped
    /// wires only): hosts on links of different speeds each want theirs.
    pub min_link_share: Option<f64>,
    /// BW per export group (export names without trailing digits: fast0..7
    /// are "fast"), Gb/s: the target's count where it has one.
    pub bw_by_group: BTreeMap<String, f64>,
    /// p99 per export group, us: fio's, the group's worst export.
    #[serde(default)]
    pub p99_by_group: BTreeMap<String, f64>,
    /// Repetitions whose fio numbers disagree with the target's or the
    /// wire's (see [`crate::check`]).
    #[serde(default)]
    pub fio_suspect_reps: usize,
}

/// Series label of a run: its target and the swept variables other than x.
pub fn series_of(r: &RunResult, swept: &[String], x: Option<&str>) -> String {
    let mut label = r.target.clone();
    for k in swept {
        if Some(k.as_str()) == x {
            continue;
        }
        if let Some(v) = r.vars.get(k) {
            let _ = write!(label, " {k}={v}");
        }
    }
    label
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn mean_opt(v: &[Option<f64>]) -> Option<f64> {
    let some: Vec<f64> = v.iter().flatten().copied().collect();
    (some.len() == v.len() && !some.is_empty()).then(|| mean(&some))
}

fn sample_sd(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// Rows in series order (first appearance), x ascending (numerically when
/// the values are numbers).
///
/// Series are ordered by their variables, then by target in `targets`
/// order, so compared targets sit side by side whatever order they ran in.
pub fn aggregate(
    results: &[RunResult],
    swept: &[String],
    x: Option<&str>,
    targets: &[String],
) -> Vec<SweepRow> {
    let mut order: Vec<(String, usize, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        let series = series_of(r, swept, x);
        if !order.iter().any(|o| o.2 == series) {
            let vars = series[r.target.len()..].to_string();
            let t = targets
                .iter()
                .position(|t| *t == r.target)
                .unwrap_or(usize::MAX);
            order.push((vars, t, series.clone()));
        }
        let xv = x
            .and_then(|k| r.vars.get(k).cloned())
            .unwrap_or_else(|| "-".into());
        groups.entry((series, xv)).or_default().push(r);
    }
    let mut rows: Vec<SweepRow> = groups
        .into_iter()
        .map(|((series, xv), runs)| sweep_row(series, xv, &runs))
        .collect();
    // Stable: variables keep their sweep order among equal keys.
    order.sort_by_key(|o| o.1);
    let mut by_vars: Vec<String> = Vec::new();
    for o in &order {
        if !by_vars.contains(&o.0) {
            by_vars.push(o.0.clone());
        }
    }
    order.sort_by_key(|o| by_vars.iter().position(|v| *v == o.0));
    rows.sort_by(|a, b| {
        let sa = order.iter().position(|s| s.2 == a.series);
        let sb = order.iter().position(|s| s.2 == b.series);
        sa.cmp(&sb)
            .then_with(|| match (a.x.parse::<f64>(), b.x.parse::<f64>()) {
                (Ok(p), Ok(q)) => p.total_cmp(&q),
                _ => a.x.cmp(&b.x),
            })
    });
    rows
}

/// One sweep row: the mean of a point's repetitions.
fn sweep_row(series: String, xv: String, runs: &[&RunResult]) -> SweepRow {
    let f = |g: &dyn Fn(&RunResult) -> f64| runs.iter().map(|r| g(r)).collect::<Vec<_>>();
    let o = |g: &dyn Fn(&RunResult) -> Option<f64>| runs.iter().map(|r| g(r)).collect::<Vec<_>>();
    let bw = f(&|r| r.fio.total.bw_gbps);
    SweepRow {
        series,
        x: xv,
        reps: runs.len(),
        total_qd: runs[0].total_qd,
        kiops: mean(&f(&|r| r.fio.total.kiops)),
        bw_gbps: mean(&bw),
        bw_rep_sd_gbps: sample_sd(&bw),
        wire_gbps: mean_opt(&o(&|r| r.fio.total.wire_gbps)),
        avg_lat_us: mean(&f(&|r| r.fio.total.avg_lat_us)),
        p99_us: mean(&f(&|r| r.fio.total.p99_us)),
        p999_us: mean(&f(&|r| percentile(&r.fio.lat_cdf, 0.999))),
        bw_stddev_gbps: mean(&f(&|r| r.fio.total.bw_dev_gbps)),
        bufs_avg_mib: mean_opt(&o(&|r| r.stats.bufs_avg_mib)),
        bufs_max_mib: mean_opt(&o(&|r| r.stats.bufs_max_mib)),
        sock_queue_mib: mean_opt(&o(&|r| r.stats.sock_queue_mib)),
        pacer_period_us: mean_opt(&o(&|r| r.stats.pacer_period_us)),
        cpu_us_per_io: mean(&f(&|r| r.stats.cpu_us_per_io)),
        min_link_share: mean_opt(&o(&min_link_share)),
        bw_by_group: mean_by_group(runs, export_groups),
        p99_by_group: mean_by_group(runs, export_group_p99),
        fio_suspect_reps: runs
            .iter()
            .filter(|r| !fio_disagreements(r).is_empty())
            .count(),
    }
}

/// The mean over `runs` of a per-group figure.
fn mean_by_group(
    runs: &[&RunResult],
    of: fn(&RunResult) -> BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    for r in runs {
        for (g, v) in of(r) {
            *m.entry(g).or_default() += v / runs.len() as f64;
        }
    }
    m
}

/// The lowest share of its own link any host of a run got.
fn min_link_share(r: &RunResult) -> Option<f64> {
    let shares: Option<Vec<f64>> = r
        .fio
        .hosts
        .iter()
        .map(crate::fio::HostRow::link_share)
        .collect();
    shares?.into_iter().reduce(f64::min)
}

/// kIOPS with three significant digits or more: 0.934, 12.5, 208.2.
fn kiops(v: f64) -> String {
    match v {
        v if v >= 100.0 => format!("{v:.1}"),
        v if v >= 10.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

/// The smallest latency with at least `q` of IOs at or below it.
pub fn percentile(cdf: &[(f64, f64)], q: f64) -> f64 {
    cdf.iter()
        .find(|(_, f)| *f >= q - 1e-9)
        .or(cdf.last())
        .map_or(0.0, |p| p.0)
}

/// The note under a sweep table whose BW is marked `!`, or None.
pub fn suspect_note(rows: &[SweepRow]) -> Option<String> {
    let n: usize = rows.iter().map(|r| r.fio_suspect_reps).sum();
    (n > 0).then(|| {
        format!(
            "\n`!`: in {n} run(s) fio's BW disagrees with the target's own count per export \
             or exceeds a host's wire (fio miscounts jobs whose IOs wait past the ramp); the \
             run tables name them, and BW by export group is the target's count.\n"
        )
    })
}

/// BW and p99 per export group, when a test has more than one group (fast
/// and slow devices, or tenants, side by side); None otherwise. Groups come
/// in `order` (the workload's exports' groups) first; with two, a column
/// gives the first's BW over the second's (a 2:1 tenant pair's ratio).
pub fn group_table(rows: &[SweepRow], x: Option<&str>, order: &[String]) -> Option<String> {
    let mut groups: Vec<String> = rows
        .iter()
        .flat_map(|r| r.bw_by_group.keys().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if groups.len() < 2 {
        return None;
    }
    groups.sort_by_key(|g| order.iter().position(|o| o == g).unwrap_or(usize::MAX));
    let x_head = match x {
        Some("qd") | None => "QD".to_string(),
        Some(k) => k.to_uppercase(),
    };
    let mut heads: Vec<String> = Vec::new();
    for g in &groups {
        heads.push(format!("{g}* BW, Gb/s"));
        heads.push(format!("{g}* p99, us"));
    }
    let pair = (groups.len() == 2).then(|| (groups[0].clone(), groups[1].clone()));
    if let Some((a, b)) = &pair {
        heads.push(format!("{a}/{b} BW"));
    }
    let mut header: Vec<&str> = vec!["Series", &x_head];
    header.extend(heads.iter().map(String::as_str));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.series.clone(),
                if x == Some("qd") || x.is_none() {
                    r.total_qd.to_string()
                } else {
                    r.x.clone()
                },
            ];
            for g in &groups {
                c.push(opt(r.bw_by_group.get(g).copied(), 3));
                c.push(opt(r.p99_by_group.get(g).copied(), 0));
            }
            if let Some((a, b)) = &pair {
                let (bw_a, bw_b) = (r.bw_by_group.get(a), r.bw_by_group.get(b));
                let ratio = bw_a
                    .zip(bw_b)
                    .filter(|(_, b)| **b > 0.0)
                    .map(|(a, b)| a / b);
                c.push(opt(ratio, 2));
            }
            c
        })
        .collect();
    Some(markdown(&header, &cells))
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// A markdown table (it is also what the console shows).
fn markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, String::len))
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut s = String::from("|");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(s, " {c:>w$} |");
        }
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    out.push('|');
    for w in &widths {
        let _ = write!(out, "{}:|", "-".repeat(w + 1));
    }
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// One row per host and the total: the host table's cells.
fn host_rows(r: &RunResult, shaped: bool, port: bool) -> Vec<Vec<String>> {
    r.fio
        .hosts
        .iter()
        .chain([&r.fio.total])
        .map(|h| {
            let mut row = vec![
                h.host.clone(),
                kiops(h.kiops),
                format!("{:.3}", h.bw_gbps),
                format!("{:.1}", h.avg_lat_us),
                opt(h.wire_gbps, 3),
            ];
            if shaped {
                row.push(opt(h.link_gbps, 3));
            }
            if port {
                row.push(opt(h.share_gbps, 3));
            }
            if shaped || port {
                row.push(opt(h.link_share().map(|x| x * 100.0), 1));
            }
            row
        })
        .collect()
}

/// The per-run table: Host | kIOPS | BW | AVG_LAT | Wire BW.
pub fn host_table(r: &RunResult, swept: &[String]) -> String {
    let vars: Vec<String> = swept
        .iter()
        .filter_map(|k| Some(format!("{k}={}", r.vars.get(k)?)))
        .collect();
    let shaped = r.fio.hosts.iter().any(|h| h.link_gbps.is_some());
    let port = r.fio.hosts.iter().any(|h| h.share_gbps.is_some());
    let mut rows = host_rows(r, shaped, port);
    if r.fio.hosts.len() == 1 {
        rows.truncate(1);
        rows[0][4] = opt(r.fio.total.wire_gbps, 3);
    }
    let mut head = vec!["Host", "kIOPS", "BW, Gb/s", "AVG_LAT, us", "Wire BW, Gb/s"];
    if shaped {
        head.push("Link, Gb/s");
    }
    if port {
        head.extend(["Share of port, Gb/s", "BW % of share"]);
    } else if shaped {
        head.push("BW % of link");
    }
    let groups = export_groups(r);
    let per_export = if groups.len() > 1 {
        let parts: Vec<String> = groups
            .iter()
            .map(|(g, bw)| format!("{g}* {bw:.3}"))
            .collect();
        format!("BW by export group, Gb/s: {}\n", parts.join(", "))
    } else {
        String::new()
    };
    let per_export = format!("{per_export}{}", port_line(r));
    let disagree = fio_disagreements(r);
    let per_export = if disagree.is_empty() {
        per_export
    } else {
        format!(
            "{per_export}fio disagrees with the target or the wire (its count is wrong for IOs \
             that wait past the ramp): {}\n",
            disagree.join("; ")
        )
    };
    format!(
        "\n{} (target {}, rep {}, {}, total QD {})\n{}{per_export}",
        r.test,
        r.target,
        r.rep,
        vars.join(" "),
        r.total_qd,
        markdown(&head, &rows)
    )
}

/// The ports the target knows, as it counted them; empty if none.
fn port_line(r: &RunResult) -> String {
    if r.stats.ports.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = r
        .stats
        .ports
        .iter()
        .map(|(name, p)| {
            format!(
                "{name} ({} Gb/s) sent {:.3}, received {:.3}",
                p.gbps, p.sent_gbps, p.received_gbps
            )
        })
        .collect();
    format!("The target's ports, Gb/s: {}\n", parts.join("; "))
}

/// One row's cells of the sweep table, the last two only for shaped links.
fn sweep_cells(r: &SweepRow, x: Option<&str>) -> Vec<String> {
    vec![
        r.series.clone(),
        if x == Some("qd") || x.is_none() {
            r.total_qd.to_string()
        } else {
            r.x.clone()
        },
        if r.fio_suspect_reps > 0 {
            format!("{:.3} !", r.bw_gbps)
        } else {
            format!("{:.3}", r.bw_gbps)
        },
        kiops(r.kiops),
        opt(r.wire_gbps, 3),
        format!("{:.1}", r.avg_lat_us),
        format!("{:.1}", r.p99_us),
        format!("{:.1}", r.p999_us),
        format!("{:.3}", r.bw_stddev_gbps),
        match (r.bufs_avg_mib, r.bufs_max_mib) {
            (Some(a), Some(m)) => format!("{a:.2} ({m:.2})"),
            (a, _) => opt(a, 2),
        },
        opt(r.sock_queue_mib, 2),
        opt(r.pacer_period_us, 1),
        format!("{:.2}", r.cpu_us_per_io),
        opt(r.min_link_share.map(|x| x * 100.0), 1),
        opt(
            r.min_link_share
                .map(|x| x * 100.0 / crate::fio::TCP_PAYLOAD_CEILING),
            1,
        ),
    ]
}

/// The sweep table, one block of rows per series.
pub fn sweep_table(rows: &[SweepRow], x: Option<&str>) -> String {
    let x_head = match x {
        Some("qd") | None => "QD".to_string(),
        Some(k) => k.to_uppercase(),
    };
    let cells: Vec<Vec<String>> = rows.iter().map(|r| sweep_cells(r, x)).collect();
    let shaped = rows.iter().any(|r| r.min_link_share.is_some());
    let cells: Vec<Vec<String>> = cells
        .into_iter()
        .map(|mut c| {
            if !shaped {
                c.truncate(c.len() - 2);
            }
            c
        })
        .collect();
    let mut head = vec![
        "Series",
        &x_head,
        "BW, Gb/s",
        "kIOPS",
        "WIRE BW, Gb/s",
        "AVG LAT, us",
        "p99, us",
        "p99.9, us",
        "BW STDDEV, Gb/s",
        "Bufs in-flight avg (max), MiB",
        "Sock queue, MiB",
        "Pacer period, us",
        "CPU/IO, us",
    ];
    if shaped {
        head.push("MIN HOST % LINK");
        head.push("MIN HOST % PAYLOAD CEILING");
    }
    markdown(&head, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fio::{FioResult, HostRow};
    use crate::result::TargetStats;

    fn run(target: &str, qd: &str, mode: &str, bw: f64) -> RunResult {
        let host = HostRow {
            host: "h1".into(),
            ios: 100,
            kiops: bw,
            bw_gbps: bw,
            avg_lat_us: 10.0,
            p99_us: 20.0,
            bw_dev_gbps: 0.1,
            wire_gbps: Some(bw * 1.05),
            link_gbps: None,
            share_gbps: None,
            busiest_dir_gbps: bw,
        };
        let total = crate::fio::total_of(std::slice::from_ref(&host));
        RunResult {
            test: "t".into(),
            key: format!("{target}-{qd}-{mode}"),
            point: 0,
            vars: BTreeMap::from([("qd".into(), qd.into()), ("mode".into(), mode.into())]),
            target: target.into(),
            rep: 0,
            total_qd: qd.parse().unwrap_or(0),
            job_iodepth: 1,
            fio: FioResult {
                hosts: vec![host],
                total,
                exports: Vec::new(),
                lat_cdf: Vec::new(),
            },
            stats: TargetStats::default(),
            window_s: 1.0,
        }
    }

    #[test]
    fn rows_average_reps_and_sort_numerically() {
        let runs = [
            run("iopace", "128", "auto", 2.0),
            run("iopace", "8", "auto", 1.0),
            run("iopace", "8", "auto", 3.0),
            run("iopace", "8", "none", 5.0),
        ];
        let swept = vec!["mode".to_string(), "qd".to_string()];
        let rows = aggregate(&runs, &swept, Some("qd"), &["iopace".to_string()]);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].series, "iopace mode=auto");
        assert_eq!((rows[0].x.as_str(), rows[0].reps), ("8", 2));
        assert!((rows[0].bw_gbps - 2.0).abs() < 1e-12);
        assert!((rows[0].bw_rep_sd_gbps - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(rows[1].x, "128");
        assert_eq!(rows[2].series, "iopace mode=none");
        let t = sweep_table(&rows, Some("qd"));
        assert!(t.contains("Pacer period, us"));
        assert_eq!(t.lines().count(), 5);
    }

    #[test]
    fn compared_targets_sit_side_by_side() {
        let runs = [
            run("b", "8", "read", 1.0),
            run("a", "8", "read", 1.0),
            run("a", "8", "write", 1.0),
            run("b", "8", "write", 1.0),
        ];
        let swept = vec!["mode".to_string(), "qd".to_string()];
        let targets = ["a".to_string(), "b".to_string()];
        let rows = aggregate(&runs, &swept, Some("qd"), &targets);
        let series: Vec<_> = rows.iter().map(|r| r.series.as_str()).collect();
        assert_eq!(
            series,
            ["a mode=read", "b mode=read", "a mode=write", "b mode=write"]
        );
    }

    #[test]
    fn percentile_reads_the_cdf() {
        let cdf = [(10.0, 0.5), (20.0, 0.99), (30.0, 0.999), (90.0, 1.0)];
        assert_eq!(percentile(&cdf, 0.5), 10.0);
        assert_eq!(percentile(&cdf, 0.999), 30.0);
        assert_eq!(percentile(&cdf, 1.0), 90.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }

    #[test]
    fn exports_group_by_name_without_digits() {
        let mut r = run("iopace", "8", "auto", 1.0);
        let rows = [
            ("fast0", 1.0, 80.0),
            ("fast1", 2.0, 120.0),
            ("slow0", 0.5, 900.0),
        ];
        for (name, bw, p99) in rows {
            r.fio.exports.push(HostRow {
                host: name.into(),
                bw_gbps: bw,
                p99_us: p99,
                ..HostRow::default()
            });
        }
        let g = export_groups(&r);
        assert_eq!(g.get("fast"), Some(&3.0));
        assert_eq!(g.get("slow"), Some(&0.5));
        let swept = vec!["qd".to_string()];
        let rows = aggregate(&[r], &swept, Some("qd"), &["iopace".to_string()]);
        assert_eq!(rows[0].p99_by_group.get("fast"), Some(&120.0));
        let order = ["slow".to_string(), "fast".to_string()];
        let t = group_table(&rows, Some("qd"), &order).expect("two groups");
        assert!(t.contains("fast* BW, Gb/s") && t.contains("3.000"), "{t}");
        assert!(t.contains("slow* p99, us") && t.contains(" 900 |"), "{t}");
        // In the workload's order: slow first, so slow/fast is 0.5 / 3.
        assert!(t.contains("slow/fast BW") && t.contains("0.17"), "{t}");
        let one = aggregate(&[run("iopace", "8", "auto", 1.0)], &swept, Some("qd"), &[]);
        assert!(group_table(&one, Some("qd"), &[]).is_none());
    }

    #[test]
    fn host_table_has_total_row_for_many_hosts() {
        let mut r = run("iopace", "8", "auto", 1.0);
        let mut h2 = r.fio.hosts[0].clone();
        h2.host = "h2".into();
        r.fio.hosts.push(h2);
        r.fio.total = crate::fio::total_of(&r.fio.hosts);
        let t = host_table(&r, &["qd".to_string()]);
        assert!(t.contains("| Total |"), "{t}");
        assert!(t.contains("2.100"), "wire total of 1.05 + 1.05: {t}");
    }

    #[test]
    fn behind_a_shaped_port_a_host_is_measured_against_its_share() {
        let mut r = run("iopace", "8", "auto", 0.45);
        r.fio.hosts[0].link_gbps = Some(1.0);
        r.fio.hosts[0].share_gbps = Some(0.5);
        r.fio.total = crate::fio::total_of(&r.fio.hosts);
        let port = crate::result::PortLoad {
            gbps: 0.5,
            sent_gbps: 0.45,
            received_gbps: 0.0,
        };
        r.stats.ports.insert("bench".into(), port);
        let t = host_table(&r, &[]);
        assert!(t.contains("Share of port, Gb/s | BW % of share"), "{t}");
        assert!(t.contains(" 90.0 |"), "0.45 of a 0.5 share: {t}");
        assert!(t.contains("bench (0.5 Gb/s) sent 0.450"), "{t}");
        assert_eq!(min_link_share(&r), Some(0.9));
    }
}
