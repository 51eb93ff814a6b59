//! The `get_stats` reply: one [`ReactorStats`] per reactor, as the target
//! counts them (`server::stats`) and its clients read them.

use std::collections::BTreeMap;

pub use pace::pacer::PacerStats;
use pace::stats::LatencySummary;
use serde::{Deserialize, Serialize};

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
    /// Of `bytes_in`, those received straight into requests' buffers
    /// (large NBD WRITE payloads, NVMe/TCP H2CData): never copied in user
    /// space. The rest went through a connection's receive buffer.
    #[serde(default)]
    pub bytes_in_direct: u64,
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

/// One target port the pacers measure (a listener's `gbps`): the bytes
/// its connections carried, over all reactors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PortStats {
    /// Its index: the port the pacers know its connections by.
    pub port: usize,
    /// Its `port` name, or its listener's address.
    pub name: String,
    pub gbps: f64,
    /// READ data sent to hosts through it, since the start.
    pub sent_bytes: u64,
    /// WRITE data received from hosts through it, since the start.
    pub received_bytes: u64,
}

/// The `get_stats` reply: one entry per reactor, and the ports the pacers
/// measure (none unless a listener gives its `gbps`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsReply {
    pub reactors: Vec<ReactorStats>,
    #[serde(default)]
    pub ports: Vec<PortStats>,
}
