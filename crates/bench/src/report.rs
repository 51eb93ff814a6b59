//! Outputs of a bench: results.json, results.csv, PNG plots and report.md
//! laid out as a test index, then a section per test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plot::{self, Series};
use crate::result::RunResult;
use crate::scenario::Loaded;
use crate::table::{self, SweepRow};

/// One scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct TestReport {
    pub name: String,
    pub title: String,
    pub description: String,
    pub scenario: PathBuf,
    pub x: Option<String>,
    /// The swept variables: a series is a target and these, x aside.
    pub swept: Vec<String>,
    /// The workload's export groups in its order (see `table::group_table`).
    #[serde(default)]
    pub export_order: Vec<String>,
    /// The initiators and wire, e.g. "2 netns hosts, 2gbit".
    pub hosts: String,
    /// Targets compared, by name.
    pub targets: Vec<String>,
    pub rows: Vec<SweepRow>,
    pub runs: Vec<RunResult>,
    pub plots: Vec<PathBuf>,
}

impl TestReport {
    pub fn new(loaded: &Loaded, mut runs: Vec<RunResult>) -> TestReport {
        let s = &loaded.scenario;
        // Sweep order, whatever order the runs were made or resumed in.
        runs.sort_by_key(|r| (r.point, r.rep));
        let swept: Vec<String> = s.sweep.keys().cloned().collect();
        let x = s.x_var().map(str::to_string);
        let targets: Vec<String> = s.target.iter().map(|t| t.name.clone()).collect();
        let rows = table::aggregate(&runs, &swept, x.as_deref(), &targets);
        TestReport {
            name: s.test.name.clone(),
            title: s.test.title.clone(),
            description: s.test.description.clone(),
            scenario: loaded.path.clone(),
            x,
            swept,
            export_order: s
                .workload
                .exports
                .iter()
                .map(|e| crate::check::group_of(e).to_string())
                .collect(),
            hosts: hosts_text(s),
            targets: targets.clone(),
            rows,
            runs,
            plots: Vec::new(),
        }
    }

    /// The sweep table, and BW per export group when there are several.
    pub fn table(&self) -> String {
        let mut t = table::sweep_table(&self.rows, self.x.as_deref());
        if let Some(note) = table::suspect_note(&self.rows) {
            t.push_str(&note);
        }
        if let Some(g) = table::group_table(&self.rows, self.x.as_deref(), &self.export_order) {
            t.push_str(
                "\nBandwidth by export group (all hosts; the target's count for iopace) \
                 and p99 (fio's, the group's worst export):\n\n",
            );
            t.push_str(&g);
        }
        t
    }

    /// Renders the plots into `dir`; a plot that fails is reported, not fatal.
    pub fn plot(&mut self, dir: &Path) -> Vec<String> {
        let mut warnings = Vec::new();
        let (bw, bufs) = self.bw_series();
        let x_label = match self.x.as_deref() {
            Some("qd") => "Total queue depth (QD)".to_string(),
            Some(k) => k.to_string(),
            None => "point".to_string(),
        };
        let log_x = self.x.as_deref() == Some("qd");
        let path = dir.join(format!("{}-bw.png", self.name));
        let title = format!("{}: {}", self.name, self.title);
        let res = if bufs.is_empty() {
            plot::line_chart(&path, &title, &x_label, "BW, Gb/s", &bw, log_x)
        } else {
            plot::two_panel_chart(
                &path,
                &title,
                &x_label,
                ("BW, Gb/s", &bw),
                ("Bufs in flight (avg), MiB", &bufs),
                log_x,
            )
        };
        match res {
            Ok(()) => self.plots.push(path),
            Err(e) => warnings.push(format!("{}: {e}", path.display())),
        }
        let cdfs = self.cdf_series();
        if !cdfs.is_empty() {
            let path = dir.join(format!("{}-lat-cdf.png", self.name));
            let title = format!("{}: completion latency CDF", self.name);
            match plot::cdf_chart(&path, &title, &cdfs) {
                Ok(()) => self.plots.push(path),
                Err(e) => warnings.push(format!("{}: {e}", path.display())),
            }
        }
        warnings
    }

    /// BW and buffers in flight per series against x.
    fn bw_series(&self) -> (Vec<Series>, Vec<Series>) {
        let numeric = self.rows.iter().all(|r| r.x.parse::<f64>().is_ok());
        let x_of = |r: &SweepRow, i: usize| -> f64 {
            if self.x.as_deref() == Some("qd") {
                f64::from(r.total_qd)
            } else if numeric {
                r.x.parse().unwrap_or(i as f64)
            } else {
                i as f64
            }
        };
        let mut bw = Vec::<Series>::new();
        let mut bufs = Vec::<Series>::new();
        for (i, r) in self.rows.iter().enumerate() {
            let idx = bw
                .iter()
                .position(|s| s.label == r.series)
                .unwrap_or_else(|| {
                    for list in [&mut bw, &mut bufs] {
                        list.push(Series {
                            label: r.series.clone(),
                            points: Vec::new(),
                        });
                    }
                    bw.len() - 1
                });
            let x = x_of(r, i);
            bw[idx].points.push((x, r.bw_gbps));
            if let Some(b) = r.bufs_avg_mib {
                bufs[idx].points.push((x, b));
            }
        }
        bufs.retain(|s| !s.points.is_empty());
        (bw, bufs)
    }

    /// Latency CDF at the largest x of each series, first repetition.
    fn cdf_series(&self) -> Vec<Series> {
        let mut cdfs: Vec<Series> = Vec::new();
        for r in &self.runs {
            if r.rep != 0 || r.fio.lat_cdf.is_empty() {
                continue;
            }
            let series = table::series_of(r, &self.swept, self.x.as_deref());
            let last_x = self
                .rows
                .iter()
                .rfind(|row| row.series == series)
                .map(|row| row.x.clone());
            let rx = self
                .x
                .as_deref()
                .and_then(|k| r.vars.get(k).cloned())
                .unwrap_or_else(|| "-".into());
            if last_x.as_deref() == Some(rx.as_str()) || last_x.is_none() {
                let label = match self.x.as_deref() {
                    Some("qd") => format!("{series} (QD {})", r.total_qd),
                    Some(k) => format!("{series} ({k}={rx})"),
                    None => series,
                };
                cdfs.push(Series {
                    label,
                    points: r.fio.lat_cdf.clone(),
                });
            }
        }
        cdfs
    }
}

/// Everything written for one `iopace bench` invocation.
#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub machine: String,
    pub tests: Vec<TestReport>,
}

impl Report {
    pub fn write(&self, out: &Path) -> Result<Vec<PathBuf>, String> {
        let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let json = out.join("results.json");
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&json, text).map_err(|e| io(&json, e))?;
        let csv = out.join("results.csv");
        self.write_csv(&csv)?;
        let md = out.join("report.md");
        std::fs::write(&md, self.markdown(out)).map_err(|e| io(&md, e))?;
        Ok(vec![json, csv, md])
    }

    fn write_csv(&self, path: &Path) -> Result<(), String> {
        let mut w = csv::Writer::from_path(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let err = |e: csv::Error| format!("{}: {e}", path.display());
        w.write_record([
            "test",
            "run",
            "target",
            "rep",
            "vars",
            "total_qd",
            "host",
            "kiops",
            "bw_gbps",
            "wire_gbps",
            "avg_lat_us",
            "p99_us",
            "bw_dev_gbps",
            "bufs_avg_mib",
            "bufs_max_mib",
            "sock_queue_mib",
            "pacer_period_us",
            "cpu_us_per_io",
        ])
        .map_err(err)?;
        let opt = |v: Option<f64>| v.map_or_else(String::new, |x| format!("{x:.4}"));
        for t in &self.tests {
            for r in &t.runs {
                let vars: Vec<String> = r.vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
                for h in r.fio.hosts.iter().chain([&r.fio.total]) {
                    w.write_record([
                        t.name.clone(),
                        r.key.clone(),
                        r.target.clone(),
                        r.rep.to_string(),
                        vars.join(" "),
                        r.total_qd.to_string(),
                        h.host.clone(),
                        format!("{:.3}", h.kiops),
                        format!("{:.4}", h.bw_gbps),
                        opt(h.wire_gbps),
                        format!("{:.2}", h.avg_lat_us),
                        format!("{:.2}", h.p99_us),
                        format!("{:.4}", h.bw_dev_gbps),
                        opt(r.stats.bufs_avg_mib),
                        opt(r.stats.bufs_max_mib),
                        opt(r.stats.sock_queue_mib),
                        opt(r.stats.pacer_period_us),
                        format!("{:.3}", r.stats.cpu_us_per_io),
                    ])
                    .map_err(err)?;
                }
            }
        }
        w.flush().map_err(|e| format!("{}: {e}", path.display()))
    }

    fn markdown(&self, out: &Path) -> String {
        let mut s = String::from("# iopace bench report\n\n");
        let _ = writeln!(
            s,
            "Command: `{}`\n\nMachine: {}\n",
            self.command, self.machine
        );
        s.push_str(
            "Units: BW and wire BW in Gb/s (10^9 bit/s); latency is fio's completion \
             plus submission latency, in us; p99 is the worst host's, p99.9 comes from all IOs' \
             completion latencies (the jobs' fio percentiles merged by IO count); BW STDDEV is the root mean square of the hosts' \
             fio bw_dev; bufs in flight are iopace's buffers in use, time-averaged over the \
             measured window (max: the peak since the target started, summed over reactors), in MiB; \
             Sock queue is what the target's TCP sockets hold sent but not yet acknowledged \
             (kernel memory in flight beyond iopace's buffers, mean of 200 ms samples), in MiB; \
             CPU/IO is the target \
             process's user+system time per IO; MIN HOST % LINK is the worst host's payload \
             in its busier direction (reads in, writes out) over its shaped link rate, which \
             it has each way, and % PAYLOAD CEILING the same over the most TCP can \
             carry on it (1448 of each 1514-byte frame). `-` means not measured (peers have no \
             buffer statistics; loopback and Unix sockets have no per-host wire).\n\n",
        );
        s.push_str(
            "| Test | Title | Targets | Hosts | Sweep | Runs |\n|---|---|---|---|---|---:|\n",
        );
        for t in &self.tests {
            let _ = writeln!(
                s,
                "| [{}](#{}) | {} | {} | {} | {} | {} |",
                t.name,
                t.name.to_lowercase(),
                t.title,
                t.targets.join(", "),
                t.hosts,
                t.swept.join(", "),
                t.runs.len()
            );
        }
        for t in &self.tests {
            let _ = writeln!(s, "\n## {}\n\n**{}**\n", t.name, t.title);
            if !t.description.is_empty() {
                let _ = writeln!(s, "{}\n", t.description.trim());
            }
            let _ = writeln!(s, "Scenario: `{}`\n", t.scenario.display());
            s.push_str(&t.table());
            for p in &t.plots {
                let rel = p.strip_prefix(out).unwrap_or(p);
                let _ = writeln!(s, "\n![{}]({})", t.name, rel.display());
            }
        }
        s
    }
}

fn hosts_text(s: &crate::scenario::Scenario) -> String {
    use crate::scenario::{HostKind, Transport};
    let h = &s.hosts;
    let n = s.host_count();
    let mut text = match (h.kind, h.transport) {
        (HostKind::Local, Transport::Unix) => format!("{n} local, Unix socket"),
        (HostKind::Local, Transport::Tcp) => format!("{n} local, loopback TCP"),
        (HostKind::Netns, _) => format!("{n} netns"),
        (HostKind::Remote, _) => format!("{n} remote"),
    };
    if let Some(r) = &h.rate {
        let _ = write!(text, ", {r}");
    }
    if let Some(d) = &h.delay {
        let _ = write!(text, ", {d} delay");
    }
    text
}

/// CPU count and kernel, for the report header.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {kernel}")
}
