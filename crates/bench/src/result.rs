//! One run's result as `iopace bench` saves it (`runs/KEY.json`) and the
//! tables, checks and reports read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fio::FioResult;

/// The target's side of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetStats {
    /// Buffers in flight, time-averaged over the measured window (iopace).
    pub bufs_avg_mib: Option<f64>,
    /// Peak buffers in use since the target started (each reactor's peak,
    /// summed: an upper bound when reactors peak at different times).
    pub bufs_max_mib: Option<f64>,
    /// Mean pacer period over the samples (rate mode and tuner), us.
    pub pacer_period_us: Option<f64>,
    /// Mean in-flight window of the auto pacer, MiB.
    pub pacer_window_mib: Option<f64>,
    /// Mean over the samples of the lowest device vrate of the active
    /// reactors (1.0: the cost model's rate; 1.0 without latency targets).
    #[serde(default)]
    pub pacer_vrate: Option<f64>,
    /// Mean bytes in the target's TCP send queues (sent, not yet acked),
    /// MiB: memory in flight that the kernel holds, not iopace's buffers.
    pub sock_queue_mib: Option<f64>,
    /// Mean requests per state over the samples.
    pub req_states: BTreeMap<String, f64>,
    pub samples: usize,
    /// Target CPU over the window, in cores.
    pub cpu_cores: f64,
    /// Target CPU per IO, us.
    pub cpu_us_per_io: f64,
    /// Replies the target finished per export over the window, per second
    /// (iopace): its own count, to check fio's per-job numbers against.
    #[serde(default)]
    pub export_replies_per_s: BTreeMap<String, f64>,
    /// Data the target moved per export over the window, Gb/s (iopace):
    /// the ground truth for fio's per-job bandwidth, which is wrong for a
    /// job whose IOs wait longer than the ramp.
    #[serde(default)]
    pub export_gbps: BTreeMap<String, f64>,
    /// Replies each reactor finished over the window, per second (iopace):
    /// how the load split between reactors, not only how the connections did.
    #[serde(default)]
    pub reactor_replies_per_s: Vec<f64>,
    /// Open connections per reactor, the larger of the counts at the
    /// window's start and end (iopace): how the acceptor spread them.
    #[serde(default)]
    pub reactor_connections: Vec<u64>,
    /// Each port the target knows (a listener that gives its `gbps`), as
    /// the target counted it over the window (iopace).
    #[serde(default)]
    pub ports: BTreeMap<String, PortLoad>,
}

/// One known port's capacity and the data the target moved through it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PortLoad {
    /// The capacity its listener gives.
    pub gbps: f64,
    /// READ data sent to hosts, Gb/s.
    pub sent_gbps: f64,
    /// WRITE data received from hosts, Gb/s.
    pub received_gbps: f64,
}

/// One run's result, saved as `runs/KEY.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub test: String,
    pub key: String,
    pub point: usize,
    pub vars: BTreeMap<String, String>,
    pub target: String,
    pub rep: u32,
    /// Total queue depth offered (per-job depth x jobs x hosts).
    pub total_qd: u32,
    pub job_iodepth: u32,
    pub fio: FioResult,
    pub stats: TargetStats,
    pub window_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Results saved before these fields existed still load.
    #[test]
    fn old_target_stats_load_without_reactor_fields() {
        let old = r#"{"req_states":{},"samples":3,"cpu_cores":1.0,"cpu_us_per_io":2.0}"#;
        let s: TargetStats = serde_json::from_str(old).expect("old json");
        assert!(s.reactor_replies_per_s.is_empty());
        assert!(s.reactor_connections.is_empty());
    }
}
