//! A run's results: one row per QD, as the seed's sweep tables have them.

use pace::Nanos;
use serde::Serialize;

use crate::model::{Sim, SLOT_NS};
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
    /// p99 per host group, us.
    pub per_group_p99_us: Vec<f64>,
    /// p99 of the time at the device (start to device completion), us.
    pub device_p99_us: f64,
    /// Mean vrate over the devices with latency targets at the end (1.0 without).
    pub vrate: f64,
    /// Every IO issued has completed or is accounted in flight at the end.
    pub conserved: bool,
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e9
}

impl Sim<'_> {
    /// The seed's BW STDDEV: RMS over hosts of each host's bandwidth stddev over time.
    fn bw_stddev(&self) -> f64 {
        let mut sq = 0.0;
        for h in &self.hosts {
            let n = h.slots.len().max(1) as f64;
            let rates: Vec<f64> = h
                .slots
                .iter()
                .map(|b| gbps(*b, SLOT_NS as f64 / 1e9))
                .collect();
            let mean = rates.iter().sum::<f64>() / n;
            sq += rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
        }
        (sq / self.hosts.len().max(1) as f64).sqrt()
    }

    /// Mean vrate over the devices with latency targets (1.0 without).
    fn vrate(&self) -> f64 {
        let targeted: Vec<f64> = (0..self.devs.len())
            .filter(|&d| self.qos.has_targets(d))
            .map(|d| self.qos.vrate(d))
            .collect();
        if targeted.is_empty() {
            1.0
        } else {
            targeted.iter().sum::<f64>() / targeted.len() as f64
        }
    }

    /// One `--trace` line: time, buffers in use, and per reactor its
    /// window, rate and latency estimates, bytes in flight and queue.
    pub fn trace_line(&self, t: Nanos) {
        let mib = |b: f64| b / f64::from(1u32 << 20);
        let bufs = mib((self.in_use() * u64::from(self.sc.target.buffer_size)) as f64);
        let mut line = format!(
            "trace {} t_ms={} bufs_mib={bufs:.2}",
            self.trace_tag,
            t / 1_000_000
        );
        for (i, p) in self.pacers.iter().enumerate() {
            let s = p.stats(t);
            line += &format!(
                " | r{i} window_mib={:.2} rate_gbps={:.1} min_lat_us={:.0} in_flight_mib={:.2} queued={}",
                mib(s.window_bytes as f64),
                s.rate_bps * 8e-9,
                s.min_latency_us,
                mib(s.bytes_in_flight as f64),
                s.queued
            );
        }
        eprintln!("{line}");
    }

    /// The row of the stretch just simulated.
    pub fn row(&self, qd: u32) -> Row {
        let end = self.now;
        let secs = self.sc.duration_ms as f64 / 1e3;
        let delivered: u64 = self.hosts.iter().map(|h| h.delivered).sum();
        let bw = gbps(delivered, secs);
        let mib = f64::from(self.sc.target.buffer_size) / (1u64 << 20) as f64;
        let mut per_group = vec![0.0; self.sc.hosts.len()];
        for h in &self.hosts {
            per_group[h.group] += gbps(h.delivered, secs);
        }
        let period = self
            .pacers
            .iter()
            .map(|p| p.stats(end).period_us)
            .sum::<f64>()
            / self.pacers.len() as f64;
        let live = self.ios.iter().filter(|i| i.live()).count() as u64;
        Row {
            qd,
            bw_gbps: bw,
            wire_gbps: bw * self.sc.target.wire_overhead,
            avg_lat_us: self.lat.mean() / 1e3,
            p99_us: self.lat.percentile(99.0) as f64 / 1e3,
            bw_stddev: self.bw_stddev(),
            bufs_mib_avg: self.bufs_gauge.avg(end) * mib,
            bufs_mib_max: self.bufs_gauge.max() as f64 * mib,
            period_us: period,
            per_group_gbps: per_group,
            per_group_p99_us: self
                .group_lat
                .iter()
                .map(|h| h.percentile(99.0) as f64 / 1e3)
                .collect(),
            device_p99_us: self.device_lat.percentile(99.0) as f64 / 1e3,
            vrate: self.vrate(),
            conserved: self.issued == self.completed + live,
        }
    }
}

/// The table header for a run: the seed's columns, then per-group and QoS ones.
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

/// The seed's sweep table, with the seed's measured rows beside ours.
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
