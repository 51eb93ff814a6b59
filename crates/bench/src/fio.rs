//! fio: job files for `fio --client`, and its JSON output reduced to
//! per-host rows and totals in the tables' units (Gb/s, us, MiB).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::scenario::Workload;

/// What one host's jobs did, in the tables' units.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostRow {
    pub host: String,
    pub ios: u64,
    pub kiops: f64,
    pub bw_gbps: f64,
    pub avg_lat_us: f64,
    pub p99_us: f64,
    /// fio's bw_dev of the host's jobs combined (root of the sum of squares).
    pub bw_dev_gbps: f64,
    /// Measured on the host's interface; None where it cannot be told apart.
    pub wire_gbps: Option<f64>,
    /// The host's shaped link rate, where the wire is shaped.
    #[serde(default)]
    pub link_gbps: Option<f64>,
    /// The host's max-min fair share of a shaped target port, each host
    /// capped by its own link; None where the port is not shaped (the
    /// share is then the link).
    #[serde(default)]
    pub share_gbps: Option<f64>,
    /// Payload of the busier direction (reads come in, writes go out): a
    /// shaped link carries its rate each way, so this is what it bounds.
    /// 0 in results written before it was kept.
    #[serde(default)]
    pub busiest_dir_gbps: f64,
}

/// The most of a shaped link's rate that can be payload: tc tbf counts
/// whole Ethernet frames (1514 bytes at MTU 1500), of which TCP with
/// timestamps carries 1448 bytes of data.
pub const TCP_PAYLOAD_CEILING: f64 = 1448.0 / 1514.0;

impl HostRow {
    /// Payload bandwidth of the busier direction as a share of what the
    /// host can take: its own link (its rate each way), or its fair share
    /// of a shaped target port where that is less.
    pub fn link_share(&self) -> Option<f64> {
        let busiest = if self.busiest_dir_gbps > 0.0 {
            self.busiest_dir_gbps
        } else {
            self.bw_gbps
        };
        self.share_gbps.or(self.link_gbps).map(|l| busiest / l)
    }
}

/// Per-host rows, their total, and the latency distribution of all IOs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FioResult {
    pub hosts: Vec<HostRow>,
    pub total: HostRow,
    /// Per export over all hosts (jobs named `HOST.EXPORT.N`): whether a
    /// slow device's neighbours still get their share.
    #[serde(default)]
    pub exports: Vec<HostRow>,
    /// (latency in us, fraction of IOs at or below it), completion latency.
    pub lat_cdf: Vec<(f64, f64)>,
}

/// A job file for one host: one job per export and per `numjobs`, named
/// `HOST.EXPORT.N` so results map back to hosts.
pub fn job_file(host: &str, w: &Workload, iodepth: u32, uri_of: &dyn Fn(&str) -> String) -> String {
    let mut s = String::from("[global]\nioengine=nbd\ntime_based\ngroup_reporting=0\n");
    let _ = writeln!(s, "rw={}", w.rw);
    if let Some(bs) = &w.bs {
        let _ = writeln!(s, "bs={bs}");
    }
    if let Some(split) = &w.bssplit {
        let _ = writeln!(s, "bssplit={split}");
    }
    let _ = writeln!(s, "iodepth={iodepth}");
    let _ = writeln!(s, "runtime={}", w.runtime);
    let _ = writeln!(s, "ramp_time={}", w.ramp);
    let _ = writeln!(s, "size={}", w.size);
    for (k, v) in &w.fio {
        let _ = writeln!(s, "{k}={v}");
    }
    for export in &w.exports {
        for n in 0..w.numjobs {
            let _ = writeln!(s, "\n[{host}.{export}.{n}]\nuri={}", uri_of(export));
            if let Some(depth) = w.iodepth_of.get(export) {
                let _ = writeln!(s, "iodepth={depth}");
            }
        }
    }
    s
}

/// An opening brace, spelled so that line-based brace counters (function
/// length checks) stay balanced.
const OPEN_BRACE: char = '\u{7b}';

/// The JSON document in fio's output: `--client` prints status lines first.
pub fn json_of(output: &str) -> Result<Value, String> {
    let start = if output.starts_with(OPEN_BRACE) {
        0
    } else {
        output
            .find(&format!("\n{OPEN_BRACE}"))
            .map(|i| i + 1)
            .ok_or_else(|| "no JSON in fio's output".to_string())?
    };
    serde_json::from_str(&output[start..]).map_err(|e| format!("fio JSON: {e}"))
}

/// Job statistics from `--client` (`client_stats`) or plain (`jobs`) output.
fn jobs(doc: &Value) -> Vec<&Value> {
    let list = doc
        .get("client_stats")
        .or_else(|| doc.get("jobs"))
        .and_then(Value::as_array);
    list.map(|l| {
        l.iter()
            .filter(|j| j.get("jobname").and_then(Value::as_str) != Some("All clients"))
            .collect()
    })
    .unwrap_or_default()
}

const DIRS: [&str; 3] = ["read", "write", "trim"];

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return 0.0,
        }
    }
    cur.as_f64().unwrap_or(0.0)
}

#[derive(Default)]
struct Acc {
    ios: f64,
    iops: f64,
    bw_bytes: f64,
    /// bw_bytes per direction, in DIRS order.
    dir_bw_bytes: [f64; 3],
    lat_ns_sum: f64,
    p99_ns: f64,
    bw_dev_sq: f64,
}

impl Acc {
    fn add_job(&mut self, job: &Value) {
        for (i, d) in DIRS.iter().enumerate() {
            let Some(s) = job.get(d) else { continue };
            let ios = num(s, &["total_ios"]);
            self.ios += ios;
            self.iops += num(s, &["iops"]);
            self.bw_bytes += num(s, &["bw_bytes"]);
            self.dir_bw_bytes[i] += num(s, &["bw_bytes"]);
            self.lat_ns_sum += num(s, &["lat_ns", "mean"]) * ios;
            if ios > 0.0 {
                self.p99_ns = self
                    .p99_ns
                    .max(num(s, &["clat_ns", "percentile", "99.000000"]));
            }
            // fio's bw_dev is in KiB/s.
            let dev = num(s, &["bw_dev"]) * 1024.0 * 8.0 / 1e9;
            self.bw_dev_sq += dev * dev;
        }
    }

    fn row(&self, host: &str) -> HostRow {
        HostRow {
            host: host.to_string(),
            ios: self.ios as u64,
            kiops: self.iops / 1e3,
            bw_gbps: self.bw_bytes * 8.0 / 1e9,
            avg_lat_us: if self.ios > 0.0 {
                self.lat_ns_sum / self.ios / 1e3
            } else {
                0.0
            },
            p99_us: self.p99_ns / 1e3,
            bw_dev_gbps: self.bw_dev_sq.sqrt(),
            wire_gbps: None,
            link_gbps: None,
            share_gbps: None,
            busiest_dir_gbps: self.dir_bw_bytes[0].max(self.dir_bw_bytes[1]) * 8.0 / 1e9,
        }
    }
}

/// Reduces fio's JSON to host rows (jobs named `HOST.…`) and a total.
///
/// Totals: IOPS and bandwidth add up, latency is the IO-weighted mean, p99
/// is the worst host's, and BW STDDEV is the root mean square of the
/// hosts' bw_dev.
pub fn reduce(doc: &Value) -> Result<FioResult, String> {
    let jobs = jobs(doc);
    if jobs.is_empty() {
        return Err("fio's JSON has no job results".into());
    }
    let mut by_host: BTreeMap<String, Acc> = BTreeMap::new();
    let mut by_export: BTreeMap<String, Acc> = BTreeMap::new();
    let mut errors = Vec::new();
    for j in &jobs {
        let name = j.get("jobname").and_then(Value::as_str).unwrap_or("?");
        let host = name.split('.').next().unwrap_or(name);
        if let Some(e) = j.get("error").and_then(Value::as_i64).filter(|&e| e != 0) {
            errors.push(format!("{name}: error {e}"));
        }
        by_host.entry(host.to_string()).or_default().add_job(j);
        if let Some(export) = name.split('.').nth(1) {
            by_export.entry(export.to_string()).or_default().add_job(j);
        }
    }
    if !errors.is_empty() {
        return Err(format!("fio jobs failed: {}", errors.join(", ")));
    }
    let hosts: Vec<HostRow> = by_host.iter().map(|(h, a)| a.row(h)).collect();
    let total = total_of(&hosts);
    Ok(FioResult {
        hosts,
        total,
        exports: by_export.iter().map(|(e, a)| a.row(e)).collect(),
        lat_cdf: lat_cdf(&jobs),
    })
}

/// The total row of per-host rows.
pub fn total_of(hosts: &[HostRow]) -> HostRow {
    let ios: u64 = hosts.iter().map(|h| h.ios).sum();
    let n = hosts.len().max(1) as f64;
    HostRow {
        host: "Total".into(),
        ios,
        kiops: hosts.iter().map(|h| h.kiops).sum(),
        bw_gbps: hosts.iter().map(|h| h.bw_gbps).sum(),
        avg_lat_us: if ios > 0 {
            hosts
                .iter()
                .map(|h| h.avg_lat_us * h.ios as f64)
                .sum::<f64>()
                / ios as f64
        } else {
            0.0
        },
        p99_us: hosts.iter().map(|h| h.p99_us).fold(0.0, f64::max),
        bw_dev_gbps: (hosts.iter().map(|h| h.bw_dev_gbps.powi(2)).sum::<f64>() / n).sqrt(),
        wire_gbps: hosts.iter().map(|h| h.wire_gbps).sum::<Option<f64>>(),
        link_gbps: hosts.iter().map(|h| h.link_gbps).sum::<Option<f64>>(),
        share_gbps: hosts.iter().map(|h| h.share_gbps).sum::<Option<f64>>(),
        busiest_dir_gbps: hosts.iter().map(|h| h.busiest_dir_gbps).sum(),
    }
}

/// The completion-latency CDF of all jobs: each job's percentile points,
/// combined by weighting each job with its IO count.
fn lat_cdf(jobs: &[&Value]) -> Vec<(f64, f64)> {
    // (latency_ns, weight) pairs: a percentile step of a job carries that
    // share of the job's IOs.
    let mut steps: Vec<(f64, f64)> = Vec::new();
    let mut total = 0.0;
    for j in jobs {
        for d in DIRS {
            let Some(s) = j.get(d) else { continue };
            let ios = num(s, &["total_ios"]);
            let Some(pct) = s
                .get("clat_ns")
                .and_then(|c| c.get("percentile"))
                .and_then(Value::as_object)
            else {
                continue;
            };
            if ios <= 0.0 {
                continue;
            }
            let mut pts: Vec<(f64, f64)> = pct
                .iter()
                .filter_map(|(k, v)| Some((k.parse::<f64>().ok()?, v.as_f64()?)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut prev = 0.0;
            for (p, lat) in pts {
                steps.push((lat, (p - prev) / 100.0 * ios));
                prev = p;
            }
            total += ios * prev / 100.0;
        }
    }
    if total <= 0.0 {
        return Vec::new();
    }
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut acc = 0.0;
    steps
        .into_iter()
        .map(|(lat, w)| {
            acc += w;
            (lat / 1e3, (acc / total).min(1.0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> Value {
        let text = include_str!("../tests/data/fio-2hosts-4k-randread.json");
        json_of(text).expect("recorded JSON parses past the status lines")
    }

    #[test]
    fn hosts_are_grouped_by_job_name_prefix() {
        let r = reduce(&recorded()).expect("reduces");
        let names: Vec<_> = r.hosts.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(names, ["h1", "h2"]);
        let exports: Vec<_> = r.exports.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(exports, ["default", "null"]);
        let by_export: f64 = r.exports.iter().map(|e| e.kiops).sum();
        assert!((by_export - r.total.kiops).abs() < 1e-9);
        // h1 ran two jobs: 53030.98 + 51642.36 IOPS.
        assert!(
            (r.hosts[0].kiops - 104.673_342).abs() < 1e-3,
            "{}",
            r.hosts[0].kiops
        );
    }

    #[test]
    fn a_link_bounds_the_busier_direction_not_the_sum() {
        // A 50/50 randrw host on a 1 Gb/s link (its rate each way) moving
        // 0.45 Gb/s in and 0.47 out uses 47% of it, not 92%.
        let job = serde_json::json!({
            "jobname": "h1.default.0",
            "read": { "total_ios": 100, "iops": 1.0, "bw_bytes": 0.45e9 / 8.0 },
            "write": { "total_ios": 100, "iops": 1.0, "bw_bytes": 0.47e9 / 8.0 },
        });
        let r = reduce(&serde_json::json!({ "jobs": [job] })).expect("reduces");
        let mut h = r.hosts[0].clone();
        h.link_gbps = Some(1.0);
        assert!((h.bw_gbps - 0.92).abs() < 1e-9, "{}", h.bw_gbps);
        assert!((h.link_share().expect("shaped") - 0.47).abs() < 1e-9);
        // Results kept before the busier direction was: the whole payload.
        h.busiest_dir_gbps = 0.0;
        assert!((h.link_share().expect("shaped") - 0.92).abs() < 1e-9);
    }

    #[test]
    fn totals_agree_with_host_rows() {
        let r = reduce(&recorded()).expect("reduces");
        let sum: f64 = r.hosts.iter().map(|h| h.kiops).sum();
        assert!((r.total.kiops - sum).abs() < 1e-9);
        // fio's own "All clients" line says 208199.8 IOPS (it divides total
        // IOs by the longest runtime, so it differs slightly from the sum).
        assert!(
            (r.total.kiops / 208.1998 - 1.0).abs() < 1e-3,
            "{}",
            r.total.kiops
        );
        let bw: f64 = r.hosts.iter().map(|h| h.bw_gbps).sum();
        assert!((r.total.bw_gbps - bw).abs() < 1e-9);
        let ios: u64 = r.hosts.iter().map(|h| h.ios).sum();
        assert_eq!(r.total.ios, ios);
        let lo = r
            .hosts
            .iter()
            .map(|h| h.avg_lat_us)
            .fold(f64::MAX, f64::min);
        let hi = r.hosts.iter().map(|h| h.avg_lat_us).fold(0.0, f64::max);
        assert!(r.total.avg_lat_us >= lo && r.total.avg_lat_us <= hi);
    }

    #[test]
    fn bw_stddev_is_rms_of_hosts() {
        let r = reduce(&recorded()).expect("reduces");
        // Per host: root of the sum of squares of its jobs' bw_dev (KiB/s).
        let g = |kib: f64| kib * 1024.0 * 8.0 / 1e9;
        let h1 = (g(3096.041451).powi(2) + g(2045.529923).powi(2)).sqrt();
        let h2 = (g(7586.527005).powi(2) + g(3152.39216).powi(2)).sqrt();
        assert!((r.hosts[0].bw_dev_gbps - h1).abs() < 1e-9);
        assert!((r.hosts[1].bw_dev_gbps - h2).abs() < 1e-9);
        let rms = ((h1 * h1 + h2 * h2) / 2.0).sqrt();
        assert!((r.total.bw_dev_gbps - rms).abs() < 1e-9);
    }

    #[test]
    fn cdf_is_monotone_and_ends_near_one() {
        let r = reduce(&recorded()).expect("reduces");
        assert!(r.lat_cdf.len() > 10);
        for w in r.lat_cdf.windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 <= w[1].1);
        }
        let last = r.lat_cdf.last().expect("points").1;
        assert!((last - 1.0).abs() < 1e-9, "{last}");
    }

    #[test]
    fn wire_total_needs_every_host() {
        let mut rows = vec![HostRow::default(), HostRow::default()];
        rows[0].wire_gbps = Some(1.0);
        assert_eq!(total_of(&rows).wire_gbps, None);
        rows[1].wire_gbps = Some(2.0);
        assert_eq!(total_of(&rows).wire_gbps, Some(3.0));
    }

    #[test]
    fn failed_jobs_and_garbage_are_errors() {
        assert!(json_of("fio: connection refused\n").is_err());
        assert!(reduce(&serde_json::json!({"client_stats": []})).is_err());
        let doc = serde_json::json!({"jobs": [{"jobname": "h1.d.0", "error": 5}]});
        assert!(reduce(&doc).expect_err("error").contains("h1.d.0"));
    }

    #[test]
    fn job_file_names_jobs_by_host() {
        let w: Workload =
            toml::from_str("bs = \"4k\"\nexports = [\"a\", \"b\"]\nnumjobs = 2").expect("w");
        let f = job_file("h3", &w, 16, &|e| format!("nbd://t/{e}"));
        assert!(f.contains("[h3.a.0]\nuri=nbd://t/a"));
        assert!(f.contains("[h3.b.1]"));
        assert!(f.contains("iodepth=16"));
        assert_eq!(f.matches("\n[h3.").count(), 4);
        let w: Workload =
            toml::from_str("exports = [\"bulk\", \"probe\"]\niodepth_of = { probe = 1 }")
                .expect("w");
        let f = job_file("h1", &w, 64, &|e| format!("nbd://t/{e}"));
        assert!(
            f.contains("[h1.probe.0]\nuri=nbd://t/probe\niodepth=1\n"),
            "{f}"
        );
        assert!(f.contains("[h1.bulk.0]\nuri=nbd://t/bulk\n") && !f.contains("bulk\niodepth"));
    }
}
