//! Per-reactor statistics: counted on the reactor thread without locks, and
//! copied out as a [`ReactorStats`] snapshot when the admin RPC asks.

use std::collections::BTreeMap;

pub use pace::pacer::PacerStats;
use pace::pool::PoolStats;
use pace::stats::{LatencyHist, LatencySummary, ReqState, StateCounts, TimeAvg};
use pace::Nanos;
use proto::Command;
use serde::{Deserialize, Serialize};

use crate::exports::Catalog;

/// A request whose reply has wholly left, as the statistics count it.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub command: Command,
    pub export: u16,
    /// The reply's error (an NBD errno, or any non-zero status), 0 for success.
    pub error: u32,
    /// Bytes of a READ or WRITE.
    pub len: u32,
    /// When its header arrived.
    pub started: Nanos,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpCount {
    pub ios: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BufferStats {
    /// Buffers held by this reactor's requests now.
    pub in_use: u64,
    /// Their bytes (small buffers are smaller).
    #[serde(default)]
    pub in_use_bytes: u64,
    /// Time-averaged and maximum buffers in use since start.
    pub in_use_avg: f64,
    pub in_use_max: u64,
    /// The same in MiB, the sweep tables' "Bufs in-flight (MiB)".
    pub in_use_avg_mib: f64,
    pub in_use_max_mib: f64,
    /// Requests that had to wait for buffers.
    pub waits: u64,
    /// Buffers parked in this reactor's cache.
    pub cached: u64,
    /// Buffers free in the shared pool (all reactors).
    pub pool_free: u64,
    /// Buffers in the pool, small and large: `pool_free` when idle.
    #[serde(default)]
    pub pool_total: u64,
    /// Bytes of the pool's mapping (its size in /proc/PID/smaps).
    #[serde(default)]
    pub pool_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExportStats {
    pub name: String,
    /// Replies sent, failed ones included.
    #[serde(default)]
    pub ios: u64,
    /// Data bytes read and written (other commands move none).
    #[serde(default)]
    pub bytes: u64,
    /// Replies that carried an error.
    #[serde(default)]
    pub errors: u64,
    /// Latency since start.
    pub latency: LatencySummary,
    /// Latency over the last [`RECENT_WINDOW_S`] to twice that.
    #[serde(default)]
    pub recent: LatencySummary,
    /// Cumulative IOs at or below each of [`LATENCY_BUCKETS_S`] (since start).
    #[serde(default)]
    pub buckets: Vec<u64>,
    /// Sum of all latencies, seconds.
    #[serde(default)]
    pub latency_sum_s: f64,
}

/// Seconds each recent-latency window covers.
pub const RECENT_WINDOW_S: u64 = 10;

/// Upper bounds of the latency histogram buckets, seconds.
pub const LATENCY_BUCKETS_S: [f64; 14] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    1.0,
];

/// Per-export counters on one reactor.
struct ExportCounters {
    name: String,
    ios: u64,
    bytes: u64,
    errors: u64,
    latency: LatencyHist,
    /// The window being filled and the one before it.
    window: LatencyHist,
    previous: LatencyHist,
    window_start: Nanos,
}

impl ExportCounters {
    fn new(name: String) -> Self {
        ExportCounters {
            name,
            ios: 0,
            bytes: 0,
            errors: 0,
            latency: LatencyHist::new(),
            window: LatencyHist::new(),
            previous: LatencyHist::new(),
            window_start: 0,
        }
    }

    /// Starts a new window when the current one is over; drops both if
    /// nothing was recorded for a whole window.
    fn roll(&mut self, now: Nanos) {
        let window = RECENT_WINDOW_S * 1_000_000_000;
        if now < self.window_start + window {
            return;
        }
        std::mem::swap(&mut self.previous, &mut self.window);
        self.window.reset();
        if now >= self.window_start + 2 * window {
            self.previous.reset();
        }
        self.window_start = now;
    }

    fn record(&mut self, now: Nanos, latency: Nanos) {
        self.roll(now);
        self.latency.record(latency);
        self.window.record(latency);
    }

    fn snapshot(&mut self, now: Nanos) -> ExportStats {
        self.roll(now);
        let mut recent = self.previous.clone();
        recent.merge(&self.window);
        ExportStats {
            name: self.name.clone(),
            ios: self.ios,
            bytes: self.bytes,
            errors: self.errors,
            latency: self.latency.summary(),
            recent: recent.summary(),
            buckets: LATENCY_BUCKETS_S
                .iter()
                .map(|s| self.latency.count_at_or_below((s * 1e9) as u64))
                .collect(),
            latency_sum_s: self.latency.mean() * self.latency.count() as f64 / 1e9,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReactorStats {
    pub reactor: usize,
    pub uptime_s: f64,
    /// Open connections, NBD and NVMe/TCP.
    pub connections: u64,
    pub connections_total: u64,
    /// Of `connections`, the NVMe/TCP ones (queues).
    #[serde(default)]
    pub nvme_connections: u64,
    pub loop_iterations: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub protocol_errors: u64,
    pub rejected_requests: u64,
    /// Connections closed by a handshake, idle or payload timeout.
    #[serde(default)]
    pub timeouts: u64,
    pub io: BTreeMap<String, OpCount>,
    pub requests_in_flight: u64,
    pub req_states: BTreeMap<String, u64>,
    pub buffers: BufferStats,
    pub delayed_completions: u64,
    pub exports: Vec<ExportStats>,
    /// The pacer's counters and estimates.
    #[serde(default)]
    pub pacer: PacerStats,
    /// Whether the reactor's waits gather completions when it is busy:
    /// off where its trials find that gathering costs its clients IOPS.
    #[serde(default)]
    pub gathering: bool,
    /// SQEs that found the ring's submission queue full and waited.
    #[serde(default)]
    pub sq_backlogged: u64,
}

/// The `get_stats` reply: one entry per reactor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsReply {
    pub reactors: Vec<ReactorStats>,
}

pub struct StatsCollector {
    pub reactor: usize,
    pub conns_now: u64,
    pub conns_total: u64,
    pub loops: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub protocol_errors: u64,
    pub rejected: u64,
    /// Connections closed by a handshake, idle or payload timeout.
    pub timeouts: u64,
    pub buffer_waits: u64,
    states: StateCounts,
    ops: [OpCount; 8],
    exports: Vec<ExportCounters>,
    buffers_in_use: TimeAvg,
    /// Their bytes: small and large buffers differ.
    buffer_bytes_in_use: TimeAvg,
}

fn op_index(c: Command) -> usize {
    match c {
        Command::Read => 0,
        Command::Write => 1,
        Command::Flush => 2,
        Command::Trim => 3,
        Command::WriteZeroes => 4,
        Command::Cache => 5,
        Command::BlockStatus => 6,
        Command::Disc | Command::Unknown(_) => 7,
    }
}

const OP_NAMES: [&str; 8] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "cache",
    "block_status",
    "other",
];

impl StatsCollector {
    pub fn new(reactor: usize, catalog: &Catalog) -> StatsCollector {
        StatsCollector {
            reactor,
            conns_now: 0,
            conns_total: 0,
            loops: 0,
            bytes_in: 0,
            bytes_out: 0,
            protocol_errors: 0,
            rejected: 0,
            timeouts: 0,
            buffer_waits: 0,
            states: StateCounts::default(),
            ops: Default::default(),
            exports: catalog
                .exports
                .iter()
                .map(|e| ExportCounters::new(e.info.name.clone()))
                .collect(),
            buffers_in_use: TimeAvg::new(0),
            buffer_bytes_in_use: TimeAvg::new(0),
        }
    }

    pub fn enter(&mut self, state: ReqState) {
        self.states.enter(state);
    }

    pub fn leave(&mut self, state: ReqState) {
        self.states.leave(state);
    }

    pub fn transition(&mut self, from: ReqState, to: ReqState) {
        self.states.leave(from);
        self.states.enter(to);
    }

    /// Requests counted in a state other than done.
    pub fn requests_in_flight(&self) -> u64 {
        self.states.in_flight()
    }

    pub fn sample_buffers(&mut self, now: Nanos, in_use: u64, in_use_bytes: u64) {
        self.buffers_in_use.update(now, in_use);
        self.buffer_bytes_in_use.update(now, in_use_bytes);
    }

    /// Requests whose replies were fully sent, since the start.
    pub fn ios_done(&self) -> u64 {
        self.ops.iter().map(|o| o.ios).sum()
    }

    /// A reply was fully sent: count the IO, its data bytes and its latency.
    pub fn record_done(&mut self, done: &Served, now: Nanos) {
        let op = &mut self.ops[op_index(done.command)];
        op.ios += 1;
        // Only reads and writes move data; a trim's or block status's length
        // is a range, not bytes.
        let moves_data = matches!(done.command, Command::Read | Command::Write);
        let bytes = if done.error == 0 && moves_data {
            u64::from(done.len)
        } else {
            0
        };
        op.bytes += bytes;
        if let Some(e) = self.exports.get_mut(usize::from(done.export)) {
            e.ios += 1;
            e.bytes += bytes;
            e.errors += u64::from(done.error != 0);
            e.record(now, now - done.started);
        }
    }

    pub fn snapshot(
        &mut self,
        now: Nanos,
        pool: PoolStats,
        (pool_free, pool_total): (u64, u64),
        timers: usize,
    ) -> ReactorStats {
        let mib = 1.0 / (1u64 << 20) as f64;
        let avg = self.buffers_in_use.avg(now);
        let (avg_bytes, max_bytes) = (
            self.buffer_bytes_in_use.avg(now),
            self.buffer_bytes_in_use.max(),
        );
        let max = self.buffers_in_use.max();
        let req_states: BTreeMap<String, u64> = ReqState::ALL
            .iter()
            .filter(|s| **s != ReqState::Done)
            .map(|s| (s.name().to_string(), self.states.get(*s)))
            .collect();
        let requests_in_flight = req_states.values().sum();
        ReactorStats {
            reactor: self.reactor,
            uptime_s: now as f64 / 1e9,
            connections: self.conns_now,
            connections_total: self.conns_total,
            nvme_connections: 0,
            loop_iterations: self.loops,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            protocol_errors: self.protocol_errors,
            rejected_requests: self.rejected,
            timeouts: self.timeouts,
            io: OP_NAMES
                .iter()
                .zip(self.ops.iter())
                .map(|(n, c)| (n.to_string(), c.clone()))
                .collect(),
            requests_in_flight,
            req_states,
            buffers: BufferStats {
                in_use: pool.in_use,
                in_use_bytes: pool.in_use_bytes,
                in_use_avg: avg,
                in_use_max: max,
                in_use_avg_mib: avg_bytes * mib,
                in_use_max_mib: max_bytes as f64 * mib,
                waits: self.buffer_waits,
                cached: pool.cached,
                pool_free,
                pool_total,
                pool_bytes: 0,
            },
            delayed_completions: timers as u64,
            exports: self.exports.iter_mut().map(|e| e.snapshot(now)).collect(),
            pacer: PacerStats::default(),
            gathering: false,
            sq_backlogged: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Recent" latency covers the last one to two windows; older IOs only
    /// count since start.
    #[test]
    fn recent_latency_forgets_old_windows() {
        let s = 1_000_000_000;
        let mut e = ExportCounters::new("a".into());
        e.record(0, 1_000_000);
        e.record(s, 2_000_000);
        assert_eq!(e.snapshot(5 * s).recent.count, 2);
        // One window on: the previous window still counts.
        assert_eq!(e.snapshot(RECENT_WINDOW_S * s + s).recent.count, 2);
        e.record(RECENT_WINDOW_S * s + 2 * s, 3_000_000);
        // Two windows on, only the newest IO is recent; all three since start.
        let snap = e.snapshot(2 * RECENT_WINDOW_S * s + 3 * s);
        assert_eq!(snap.recent.count, 1);
        assert_eq!(snap.latency.count, 3);
        // Nothing for two whole windows: nothing recent.
        assert_eq!(e.snapshot(5 * RECENT_WINDOW_S * s).recent.count, 0);
    }

    /// The reply crosses the RPC as JSON and comes back typed, pacer included.
    #[test]
    fn stats_reply_round_trips_typed() {
        let mut r = ReactorStats {
            reactor: 1,
            ..ReactorStats::default()
        };
        r.pacer.mode = pace::pacer::Mode::Rate;
        r.pacer.window_bytes = 7 << 20;
        r.pacer.tenants.push(pace::pacer::TenantStats {
            name: "a".into(),
            weight: 2.0,
            usage_bytes: 9,
            ..Default::default()
        });
        let reply = StatsReply { reactors: vec![r] };
        let json = serde_json::to_string(&reply).expect("serialize");
        let back: StatsReply = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back.reactors[0].pacer, reply.reactors[0].pacer);
        assert_eq!(back.reactors[0].reactor, 1);
    }
}
