//! iopace's own numbers over a run's measured window: its `get_stats`
//! sampled during the window and snapshots at either end, made into the
//! run's [`TargetStats`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use admin::stats::PacerStats;

use crate::procs;
use crate::result::{PortLoad, TargetStats};
use crate::target_proc::{self, Listen};

/// The target's own numbers over the measured window.
pub(crate) fn target_stats(
    sampler: Sampler,
    start: &Snapshot,
    end: &Snapshot,
    secs: f64,
    ios: u64,
) -> TargetStats {
    let mut stats = sampler.finish();
    stats.bufs_max_mib = end.bufs_peak;
    let rate = |name: &String, end: u64, pick: fn(&ExportCounts) -> u64| {
        let before = start.exports.get(name).map_or(0, pick);
        // Another process's counters: a target that restarted between the
        // snapshots counts from zero again, which reads as nothing moved.
        end.saturating_sub(before) as f64 / secs
    };
    for (name, c) in &end.exports {
        let replies = rate(name, c.replies, |c| c.replies);
        let bytes = rate(name, c.bytes, |c| c.bytes);
        stats.export_replies_per_s.insert(name.clone(), replies);
        stats.export_gbps.insert(name.clone(), bytes * 8.0 / 1e9);
    }
    stats.ports = port_loads(&start.ports, &end.ports, secs);
    stats.reactor_replies_per_s = per_reactor_rates(&start.reactors, &end.reactors, secs);
    stats.reactor_connections = start
        .reactors
        .iter()
        .zip(&end.reactors)
        .map(|(a, b)| a.connections.max(b.connections))
        .collect();
    if let (Some(a), Some(b)) = (start.bufs, end.bufs) {
        stats.bufs_avg_mib = Some(((b.0 * b.1 - a.0 * a.1) / (b.1 - a.1).max(1e-9)).max(0.0));
    }
    if let (Some(a), Some(b)) = (start.cpu, end.cpu) {
        stats.cpu_cores = (b - a) / secs;
        stats.cpu_us_per_io = (b - a) * 1e6 / ios.max(1) as f64;
    }
    stats
}

/// Each known port's load between two snapshots.
fn port_loads(
    start: &BTreeMap<String, admin::stats::PortStats>,
    end: &BTreeMap<String, admin::stats::PortStats>,
    secs: f64,
) -> BTreeMap<String, PortLoad> {
    let gbps = |a: u64, b: u64| b.saturating_sub(a) as f64 * 8.0 / secs.max(1e-9) / 1e9;
    end.iter()
        .map(|(name, b)| {
            let (sent, received) = start
                .get(name)
                .map_or((0, 0), |a| (a.sent_bytes, a.received_bytes));
            let load = PortLoad {
                gbps: b.gbps,
                sent_gbps: gbps(sent, b.sent_bytes),
                received_gbps: gbps(received, b.received_bytes),
            };
            (name.clone(), load)
        })
        .collect()
}

/// Counters at one instant.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub(crate) at: Instant,
    pub(crate) link: Vec<u64>,
    cpu: Option<f64>,
    /// (time-averaged MiB in use since start, uptime seconds), summed over reactors.
    bufs: Option<(f64, f64)>,
    /// Peak MiB in use since start, summed over reactors.
    bufs_peak: Option<f64>,
    /// Replies and data bytes since start per export, summed over reactors.
    exports: BTreeMap<String, ExportCounts>,
    /// Each reactor's counts, in reactor order.
    reactors: Vec<ReactorCounts>,
    /// The known ports' counts since start, by name.
    ports: BTreeMap<String, admin::stats::PortStats>,
}

/// One export's counts at one instant, summed over reactors.
#[derive(Debug, Clone, Copy, Default)]
struct ExportCounts {
    replies: u64,
    bytes: u64,
}

/// One reactor's counts at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ReactorCounts {
    /// Replies sent since start, every command.
    replies: u64,
    /// Connections open now.
    connections: u64,
}

/// Each reactor's counts from a `get_stats` reply, in reactor order (the
/// reply's order is not promised, so sort by the reactor's index).
fn reactor_counts(reactors: &[admin::stats::ReactorStats]) -> Vec<ReactorCounts> {
    let mut sorted: Vec<_> = reactors.iter().collect();
    sorted.sort_by_key(|r| r.reactor);
    sorted
        .iter()
        .map(|r| ReactorCounts {
            replies: r.io.values().map(|c| c.ios).sum(),
            connections: r.connections,
        })
        .collect()
}

/// Replies per second of each reactor between two snapshots; empty when
/// the snapshots disagree on the reactors (one of them failed).
fn per_reactor_rates(start: &[ReactorCounts], end: &[ReactorCounts], secs: f64) -> Vec<f64> {
    if start.len() != end.len() {
        return Vec::new();
    }
    start
        .iter()
        .zip(end)
        .map(|(a, b)| b.replies.saturating_sub(a.replies) as f64 / secs.max(1e-9))
        .collect()
}

impl Snapshot {
    /// `link`: the hosts' interface counters at this instant.
    pub(crate) fn take(link: Vec<u64>, target: &target_proc::Running) -> Snapshot {
        let stats = target.rpc.as_ref().and_then(|p| admin::get_stats(p).ok());
        let reactors = stats.as_ref().map_or(&[][..], |st| &st.reactors[..]);
        let mut exports: BTreeMap<String, ExportCounts> = BTreeMap::new();
        for e in reactors.iter().flat_map(|r| &r.exports) {
            let c = exports.entry(e.name.clone()).or_default();
            c.replies += e.latency.count;
            c.bytes += e.bytes;
        }
        let bufs_peak = stats
            .as_ref()
            .map(|_| reactors.iter().map(|r| r.buffers.in_use_max_mib).sum());
        let bufs = reactors.first().map(|first| {
            let avg: f64 = reactors.iter().map(|r| r.buffers.in_use_avg_mib).sum();
            (avg, first.uptime_s)
        });
        let ports = stats.as_ref().map_or_else(BTreeMap::new, |st| {
            st.ports
                .iter()
                .map(|p| (p.name.clone(), p.clone()))
                .collect()
        });
        Snapshot {
            exports,
            ports,
            reactors: reactor_counts(reactors),
            at: Instant::now(),
            link,
            cpu: procs::cpu_seconds_tree(target.proc.pid()),
            bufs,
            bufs_peak,
        }
    }
}

/// Samples of iopace's stats during the measured window.
#[derive(Default)]
pub(crate) struct Sampler {
    n: usize,
    periods: Vec<f64>,
    windows: Vec<f64>,
    vrates: Vec<f64>,
    sock_queue: Vec<f64>,
    states: BTreeMap<String, f64>,
}

impl Sampler {
    pub(crate) fn sample(&mut self, rpc: Option<&PathBuf>, listen: &Listen) {
        if let Listen::Tcp { port, .. } = listen {
            self.sock_queue
                .push(procs::tcp_send_queue(*port) as f64 / (1u64 << 20) as f64);
        }
        let Some(Ok(st)) = rpc.map(|p| admin::get_stats(p)) else {
            return;
        };
        self.n += 1;
        let active: Vec<&PacerStats> = st
            .reactors
            .iter()
            .map(|r| &r.pacer)
            .filter(|p| p.ios > 0)
            .collect();
        let mean = |f: &dyn Fn(&PacerStats) -> Option<f64>| {
            let v: Vec<f64> = active.iter().filter_map(|p| f(p)).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        if let Some(p) = mean(&|p| Some(p.period_us).filter(|x| *x > 0.0)) {
            self.periods.push(p);
        }
        if let Some(w) = mean(&|p| Some(p.window_bytes as f64)) {
            self.windows.push(w / (1u64 << 20) as f64);
        }
        if let Some(v) = active.iter().map(|p| p.vrate).reduce(f64::min) {
            self.vrates.push(v);
        }
        for r in &st.reactors {
            for (k, v) in &r.req_states {
                *self.states.entry(k.clone()).or_default() += *v as f64;
            }
        }
    }

    pub(crate) fn finish(self) -> TargetStats {
        let avg = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let n = self.n.max(1) as f64;
        TargetStats {
            bufs_avg_mib: None,
            bufs_max_mib: None,
            pacer_period_us: avg(&self.periods),
            pacer_window_mib: avg(&self.windows),
            pacer_vrate: avg(&self.vrates),
            sock_queue_mib: avg(&self.sock_queue),
            req_states: self.states.into_iter().map(|(k, v)| (k, v / n)).collect(),
            samples: self.n,
            cpu_cores: 0.0,
            cpu_us_per_io: 0.0,
            export_replies_per_s: BTreeMap::new(),
            export_gbps: BTreeMap::new(),
            reactor_replies_per_s: Vec::new(),
            reactor_connections: Vec::new(),
            ports: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use admin::stats::{OpCount, ReactorStats, StatsReply};

    #[test]
    fn a_known_port_s_load_is_the_bytes_it_moved_in_the_window() {
        let port = |sent: u64, received: u64| admin::stats::PortStats {
            port: 0,
            name: "bench".into(),
            gbps: 1.0,
            sent_bytes: sent,
            received_bytes: received,
        };
        let start = BTreeMap::from([("bench".to_string(), port(1_000, 0))]);
        let end = BTreeMap::from([("bench".to_string(), port(250_001_000, 125_000_000))]);
        let loads = port_loads(&start, &end, 2.0);
        let bench = loads["bench"];
        assert_eq!(bench.gbps, 1.0);
        assert!((bench.sent_gbps - 1.0).abs() < 1e-9, "{bench:?}");
        assert!((bench.received_gbps - 0.5).abs() < 1e-9, "{bench:?}");
        // A port first seen at the end counts from zero.
        assert_eq!(
            port_loads(&BTreeMap::new(), &end, 2.0)["bench"].received_gbps,
            0.5
        );
    }

    fn reactor(index: usize, reads: u64, writes: u64, connections: u64) -> ReactorStats {
        let mut r = ReactorStats {
            reactor: index,
            connections,
            ..ReactorStats::default()
        };
        for (op, ios) in [("read", reads), ("write", writes)] {
            r.io.insert(op.into(), OpCount { ios, bytes: 0 });
        }
        r
    }

    /// Parsed from the JSON the admin socket sends, out of reactor order:
    /// replies count every command, connections are the open ones.
    #[test]
    fn the_sampled_vrate_is_their_mean_and_absent_without_samples() {
        let s = Sampler {
            vrates: vec![0.3, 0.5],
            ..Sampler::default()
        };
        let v = s.finish().pacer_vrate.expect("a vrate");
        assert!((v - 0.4).abs() < 1e-12, "{v}");
        assert_eq!(Sampler::default().finish().pacer_vrate, None);
    }

    #[test]
    fn reactor_counts_come_from_the_stats_reply() {
        let reply = StatsReply {
            reactors: vec![reactor(1, 50, 5, 2), reactor(0, 100, 0, 1)],
            ..Default::default()
        };
        let json = serde_json::to_value(&reply).expect("serialize");
        let back: StatsReply = serde_json::from_value(json).expect("parse");
        let counts = reactor_counts(&back.reactors);
        let want = [
            ReactorCounts {
                replies: 100,
                connections: 1,
            },
            ReactorCounts {
                replies: 55,
                connections: 2,
            },
        ];
        assert_eq!(counts, want);
    }

    #[test]
    fn reactor_rates_are_per_second_over_the_window() {
        let at = |replies| ReactorCounts {
            replies,
            connections: 1,
        };
        let rates = per_reactor_rates(&[at(100), at(0)], &[at(300), at(50)], 2.0);
        assert_eq!(rates, vec![100.0, 25.0]);
        // A failed snapshot on one end: no numbers rather than wrong ones.
        assert!(per_reactor_rates(&[], &[at(5)], 1.0).is_empty());
    }
}
