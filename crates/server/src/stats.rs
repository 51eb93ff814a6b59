//! Per-reactor statistics: counted on the reactor thread without locks, and
//! copied out as a [`ReactorStats`] snapshot when the admin RPC asks.

use std::collections::BTreeMap;

pub(crate) use admin::stats::{
    BufferStats, ExportStats, OpCount, PacerStats, ReactorStats, LATENCY_BUCKETS_S, RECENT_WINDOW_S,
};
use pace::stats::{LatencyHist, StatState, StateCounts, TimeAvg};
use pace::Nanos;
use pool::PoolStats;
use proto::Command;

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

/// Per-export counters on one reactor.
struct ExportCounters {
    name: String,
    ios: u64,
    bytes: u64,
    errors: u64,
    /// Every IO's latency before the window being filled (merged in as
    /// each window closes): with `window`, the latency since start. An IO
    /// is recorded once, into `window`.
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
        self.latency.merge(&self.window);
        std::mem::swap(&mut self.previous, &mut self.window);
        self.window.reset();
        if now >= self.window_start + 2 * window {
            self.previous.reset();
        }
        self.window_start = now;
    }

    fn record(&mut self, now: Nanos, latency: Nanos) {
        self.roll(now);
        self.window.record(latency);
    }

    fn snapshot(&mut self, now: Nanos) -> ExportStats {
        self.roll(now);
        let mut recent = self.previous.clone();
        recent.merge(&self.window);
        let mut all = self.latency.clone();
        all.merge(&self.window);
        ExportStats {
            name: self.name.clone(),
            ios: self.ios,
            bytes: self.bytes,
            errors: self.errors,
            latency: all.summary(),
            recent: recent.summary(),
            buckets: LATENCY_BUCKETS_S
                .iter()
                .map(|s| all.count_at_or_below((s * 1e9) as u64))
                .collect(),
            latency_sum_s: all.mean() * all.count() as f64 / 1e9,
        }
    }
}

pub struct StatsCollector {
    pub reactor: usize,
    pub conns_now: u64,
    pub conns_total: u64,
    pub loops: u64,
    pub bytes_in: u64,
    /// Of `bytes_in`, received straight into requests' buffers.
    pub bytes_in_direct: u64,
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
            bytes_in_direct: 0,
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

    pub fn enter(&mut self, state: StatState) {
        self.states.enter(state);
    }

    pub fn leave(&mut self, state: StatState) {
        self.states.leave(state);
    }

    pub fn transition(&mut self, from: StatState, to: StatState) {
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
        let req_states: BTreeMap<String, u64> = StatState::ALL
            .iter()
            .filter(|s| **s != StatState::Done)
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
            bytes_in_direct: self.bytes_in_direct,
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
    use admin::stats::StatsReply;

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

    /// The latency since start, kept as closed windows plus the open one,
    /// reads as a histogram every IO was recorded into: the same summary
    /// and buckets, across window rolls, gaps and large values.
    #[test]
    fn latency_since_start_is_every_io_recorded_once() {
        let s = 1_000_000_000;
        let mut e = ExportCounters::new("a".into());
        let mut reference = LatencyHist::new();
        let mut now = 0;
        let mut x: u64 = 12345;
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Mostly microseconds, now and then seconds (auto-resizing).
            let lat = if i % 997 == 0 {
                (x >> 20) % (30 * s)
            } else {
                (x >> 40) % 5_000_000
            };
            now += (x >> 50) % (s / 100)
                + if i % 4000 == 0 {
                    3 * RECENT_WINDOW_S * s
                } else {
                    0
                };
            e.record(now, lat);
            reference.record(lat);
            if i % 3001 == 0 {
                let snap = e.snapshot(now);
                assert_eq!(snap.latency, reference.summary());
            }
        }
        let snap = e.snapshot(now + s);
        assert_eq!(snap.latency, reference.summary());
        let buckets: Vec<u64> = (LATENCY_BUCKETS_S.iter())
            .map(|b| reference.count_at_or_below((b * 1e9) as u64))
            .collect();
        assert_eq!(snap.buckets, buckets);
        let sum = reference.mean() * reference.count() as f64 / 1e9;
        assert_eq!(snap.latency_sum_s, sum);
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
        let reply = StatsReply {
            reactors: vec![r],
            ..Default::default()
        };
        let json = serde_json::to_string(&reply).expect("serialize");
        let back: StatsReply = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back.reactors[0].pacer, reply.reactors[0].pacer);
        assert_eq!(back.reactors[0].reactor, 1);
    }
}
