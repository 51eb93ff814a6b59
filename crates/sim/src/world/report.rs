//! The numbers of a run: what is measured as it goes (latencies, the
//! buffer gauge, IOs issued and completed), one row of the report over a
//! read-only view of the world, and `--trace` lines.

use pace::pacer::Held;
use pace::stats::{LatencyHist, TimeAvg};
use pace::Nanos;

use super::SLOT_NS;
use crate::devices::Dev;
use crate::hosts::Host;
use crate::report::{gbps, Row};
use crate::scenario::Scenario;
use crate::target::Target;

/// What a row reads of the world at the end of a stretch.
pub(super) struct View<'s> {
    pub sc: &'s Scenario,
    pub hosts: &'s [Host],
    pub devs: &'s [Dev],
    pub target: &'s Target,
    /// IOs outstanding.
    pub live: u64,
    pub end: Nanos,
}

pub(super) struct Meter {
    /// Past the warm-up: latencies and bytes count.
    measuring: bool,
    lat: LatencyHist,
    group_lat: Vec<LatencyHist>,
    device_lat: LatencyHist,
    bufs_gauge: TimeAvg,
    issued: u64,
    completed: u64,
    /// Names the run in `--trace` lines.
    trace_tag: String,
}

impl Meter {
    pub fn new(groups: usize, trace_tag: String) -> Meter {
        Meter {
            measuring: false,
            lat: LatencyHist::new(),
            group_lat: (0..groups).map(|_| LatencyHist::new()).collect(),
            device_lat: LatencyHist::new(),
            bufs_gauge: TimeAvg::new(0),
            issued: 0,
            completed: 0,
            trace_tag,
        }
    }

    /// The warm-up ends at `t`, with `bytes` of buffers in use: what
    /// follows is measured.
    pub fn start(&mut self, t: Nanos, bytes: u64) {
        self.measuring = true;
        self.bufs_gauge.update(t, bytes);
        self.bufs_gauge.reset(t);
    }

    pub fn measuring(&self) -> bool {
        self.measuring
    }

    /// Bytes of buffers in use from `t` on.
    pub fn gauge(&mut self, t: Nanos, bytes: u64) {
        self.bufs_gauge.update(t, bytes);
    }

    pub fn issued(&mut self) {
        self.issued += 1;
    }

    /// Every IO issued has its reply.
    #[cfg(test)]
    pub fn all_answered(&self) -> bool {
        self.completed >= self.issued
    }

    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// An IO of `bytes` issued at `issued` got its reply at `now`, on
    /// `host`; the warm-up ended at `warm`.
    pub fn answered(
        &mut self,
        host: &mut Host,
        bytes: u32,
        issued: Nanos,
        now: Nanos,
        warm: Nanos,
    ) {
        self.completed += 1;
        if !self.measuring {
            return;
        }
        let lat = now - issued;
        self.lat.record(lat);
        self.group_lat[host.group].record(lat);
        let slot = ((now - warm) / SLOT_NS) as usize;
        host.delivered += u64::from(bytes);
        if host.slots.len() <= slot {
            host.slots.resize(slot + 1, 0);
        }
        host.slots[slot] += u64::from(bytes);
    }

    /// A device IO took `lat`.
    pub fn device(&mut self, lat: Nanos) {
        if self.measuring {
            self.device_lat.record(lat);
        }
    }

    /// One `--trace` line: time, buffers in use, and per reactor its
    /// window, rate and latency estimates, bytes in flight and queue.
    pub fn trace_line(&self, t: Nanos, target: &Target) {
        let mib = |b: f64| b / f64::from(1u32 << 20);
        let bufs = mib(target.buffer_bytes_in_use() as f64);
        let mut line = format!(
            "trace {} t_ms={} bufs_mib={bufs:.2}",
            self.trace_tag,
            t / 1_000_000
        );
        for (i, e) in target.engines.iter().enumerate() {
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
            line += &held_field(&e.pacer().census());
        }
        eprintln!("{line}");
    }

    /// The row of the stretch just simulated.
    pub fn row(&self, qd: u32, v: &View) -> Row {
        let secs = v.sc.duration_ms as f64 / 1e3;
        let delivered: u64 = v.hosts.iter().map(|h| h.delivered).sum();
        let bw = gbps(delivered, secs);
        let mib = 1.0 / (1u64 << 20) as f64;
        let mut per_group = vec![0.0; v.sc.hosts.len()];
        for h in v.hosts {
            per_group[h.group] += gbps(h.delivered, secs);
        }
        let engines = &v.target.engines;
        let period = engines
            .iter()
            .map(|e| e.pacer().stats(v.end).period_us)
            .sum::<f64>()
            / engines.len() as f64;
        let busy: Vec<f64> = v
            .devs
            .iter()
            .filter_map(Dev::busy_share)
            .filter(|&b| b > 0.0)
            .collect();
        Row {
            qd,
            bw_gbps: bw,
            wire_gbps: bw * v.sc.target.wire_overhead,
            avg_lat_us: self.lat.mean() / 1e3,
            p99_us: self.lat.percentile(99.0) as f64 / 1e3,
            bw_stddev: bw_stddev(v.hosts),
            bufs_mib_avg: self.bufs_gauge.avg(v.end) * mib,
            bufs_mib_max: self.bufs_gauge.max() as f64 * mib,
            period_us: period,
            per_group_gbps: per_group,
            per_host_gbps: v.hosts.iter().map(|h| gbps(h.delivered, secs)).collect(),
            per_group_p99_us: self
                .group_lat
                .iter()
                .map(|h| h.percentile(99.0) as f64 / 1e3)
                .collect(),
            device_p99_us: self.device_lat.percentile(99.0) as f64 / 1e3,
            device_busy_max_pct: busy.iter().copied().fold(0.0, f64::max) * 100.0,
            device_busy_min_pct: busy.iter().copied().reduce(f64::min).unwrap_or(0.0) * 100.0,
            vrate: vrate(v.devs.len(), v.target),
            conserved: self.issued == self.completed + v.live,
        }
    }
}

/// BW STDDEV: the RMS over hosts of each host's bandwidth stddev over time.
fn bw_stddev(hosts: &[Host]) -> f64 {
    let mut sq = 0.0;
    for h in hosts {
        let n = h.slots.len().max(1) as f64;
        let rates: Vec<f64> = h
            .slots
            .iter()
            .map(|b| gbps(*b, SLOT_NS as f64 / 1e9))
            .collect();
        let mean = rates.iter().sum::<f64>() / n;
        sq += rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    }
    (sq / hosts.len().max(1) as f64).sqrt()
}

/// Mean vrate over the devices with latency targets (1.0 without).
fn vrate(devs: usize, target: &Target) -> f64 {
    let targeted: Vec<f64> = (0..devs)
        .filter(|&d| target.qos.has_targets(d))
        .map(|d| target.qos.vrate(d))
        .collect();
    if targeted.is_empty() {
        1.0
    } else {
        targeted.iter().sum::<f64>() / targeted.len() as f64
    }
}

/// A trace line's `held=` field: per tenant with IO queued, on how many
/// devices its next IO waits for its flows' windows (f), the reactor's
/// shared window (r), the device's window (d), or none of these (o).
fn held_field(census: &[Held]) -> String {
    let tenants: Vec<String> = census
        .iter()
        .enumerate()
        .filter(|(_, h)| **h != Held::default())
        .map(|(t, h)| format!("t{t}:f{}r{}d{}o{}", h.flows, h.reactor, h.device, h.open))
        .collect();
    format!(" held={}", tenants.join(","))
}
