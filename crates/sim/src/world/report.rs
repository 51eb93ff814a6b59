//! The numbers of a run: one row of the report, and `--trace` lines.

use pace::Nanos;

use super::{Sim, SLOT_NS};
use crate::devices::Dev;
use crate::report::{gbps, Row};

impl Sim<'_> {
    /// BW STDDEV: the RMS over hosts of each host's bandwidth stddev over time.
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
            .filter(|&d| self.target.qos.has_targets(d))
            .map(|d| self.target.qos.vrate(d))
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
        let bufs = mib(self.in_use_bytes() as f64);
        let mut line = format!(
            "trace {} t_ms={} bufs_mib={bufs:.2}",
            self.trace_tag,
            t / 1_000_000
        );
        for (i, e) in self.target.engines.iter().enumerate() {
            let s = e.pacer().stats(t);
            line += &format!(
                " | r{i} window_mib={:.2} depth={:.2} rate_gbps={:.1} min_lat_us={:.0} in_flight_mib={:.2} queued={}",
                mib(s.window_bytes as f64),
                s.depth,
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
        let mib = 1.0 / (1u64 << 20) as f64;
        let mut per_group = vec![0.0; self.sc.hosts.len()];
        for h in &self.hosts {
            per_group[h.group] += gbps(h.delivered, secs);
        }
        let engines = &self.target.engines;
        let period = engines
            .iter()
            .map(|e| e.pacer().stats(end).period_us)
            .sum::<f64>()
            / engines.len() as f64;
        let live = self.ios.iter().filter(|i| i.live).count() as u64;
        let busy: Vec<f64> = self
            .devs
            .iter()
            .filter_map(Dev::busy_share)
            .filter(|&b| b > 0.0)
            .collect();
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
            per_host_gbps: self.hosts.iter().map(|h| gbps(h.delivered, secs)).collect(),
            per_group_p99_us: self
                .group_lat
                .iter()
                .map(|h| h.percentile(99.0) as f64 / 1e3)
                .collect(),
            device_p99_us: self.device_lat.percentile(99.0) as f64 / 1e3,
            device_busy_max_pct: busy.iter().copied().fold(0.0, f64::max) * 100.0,
            device_busy_min_pct: busy.iter().copied().reduce(f64::min).unwrap_or(0.0) * 100.0,
            vrate: self.vrate(),
            conserved: self.issued == self.completed + live,
        }
    }
}
