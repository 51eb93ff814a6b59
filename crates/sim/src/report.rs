//! A run's results: one row per QD (the sweep table).

use serde::Serialize;

use crate::scenario::{RunConfig, Scenario};

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub qd: u32,
    pub bw_gbps: f64,
    pub wire_gbps: f64,
    pub avg_lat_us: f64,
    pub p99_us: f64,
    pub bw_stddev: f64,
    pub bufs_mib_avg: f64,
    pub bufs_mib_max: f64,
    pub period_us: f64,
    /// Payload Gb/s per host group.
    pub per_group_gbps: Vec<f64>,
    /// Payload Gb/s per host (for the oracle; not in the JSON rows).
    #[serde(skip)]
    pub per_host_gbps: Vec<f64>,
    /// p99 per host group, us.
    pub per_group_p99_us: Vec<f64>,
    /// p99 of the time at the device (start to device completion), us.
    pub device_p99_us: f64,
    /// The busiest drive's share of its channels' time spent serving IO in
    /// the measured stretch, % (0 with delay devices only).
    pub device_busy_max_pct: f64,
    /// The same for the least busy drive that served any IO: near 100,
    /// every drive in use binds, whatever bytes its mix of sizes carries.
    pub device_busy_min_pct: f64,
    /// Mean vrate over the devices with latency targets at the end (1.0 without).
    pub vrate: f64,
    /// Every IO issued has completed or is accounted in flight at the end.
    pub conserved: bool,
}

pub(crate) fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e9
}

/// The table header for a run: bandwidth, latency, spread and buffers, then per-group and QoS columns.
fn header(groups: bool, qos: bool) -> String {
    let mut s = String::from(
        "| QD | BW | WIRE BW | AVG LAT, us | p99, us | BW STDDEV | Bufs in-flight (MiB) | Pacer period, us | seed BW | seed Bufs (MiB) |",
    );
    if groups {
        s += " per group Gb/s (p99 us) |";
    }
    if qos {
        s += " device p99, us | vrate |";
    }
    s += "\n|---|---|---|---|---|---|---|---|---|---|";
    if groups {
        s += "---|";
    }
    if qos {
        s += "---|---|";
    }
    s + "\n"
}

fn line(r: &Row, run: &RunConfig, groups: bool, qos: bool) -> String {
    let seed = run.seed_rows.iter().find(|x| x.0 == r.qd);
    let (sbw, sbuf) = seed.map_or(("".into(), "".into()), |x| {
        (format!("{:.1}", x.1), format!("{:.1}", x.2))
    });
    let mut s = format!(
        "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} ({:.1}) | {:.2} | {sbw} | {sbuf} |",
        r.qd,
        r.bw_gbps,
        r.wire_gbps,
        r.avg_lat_us,
        r.p99_us,
        r.bw_stddev,
        r.bufs_mib_avg,
        r.bufs_mib_max,
        r.period_us
    );
    if groups {
        let g: Vec<String> = r
            .per_group_gbps
            .iter()
            .zip(&r.per_group_p99_us)
            .map(|(b, p)| format!("{b:.1} ({p:.0})"))
            .collect();
        s += &format!(" {} |", g.join(", "));
    }
    if qos {
        s += &format!(" {:.0} | {:.2} |", r.device_p99_us, r.vrate);
    }
    s + "\n"
}

/// The sweep table, with the SPDK target's measured rows (`seed_rows`) beside ours.
pub fn render(sc: &Scenario, results: &[(String, Vec<Row>)]) -> String {
    let mut s = format!("### {}\n\n", sc.name);
    if !sc.description.is_empty() {
        s += &format!("{}\n\n", sc.description);
    }
    let groups = sc.hosts.len() > 1;
    for ((label, rows), run) in results.iter().zip(&sc.runs) {
        let qos = run.qos.is_some() || sc.devices.iter().any(|g| g.qos.is_some());
        s += &format!("**{label}**\n\n");
        s += &header(groups, qos);
        for r in rows {
            s += &line(r, run, groups, qos);
        }
        s += "\n";
    }
    s
}
