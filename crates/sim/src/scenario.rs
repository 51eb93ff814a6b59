//! A simulation scenario as its TOML file says it: the target, its ports,
//! devices and hosts, and the runs (pacing configs) to compare.

use pace::pacer::{CostModel, PacingConfig, QosConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "one_u64")]
    pub seed: u64,
    #[serde(default = "default_duration")]
    pub duration_ms: u64,
    #[serde(default = "default_warmup")]
    pub warmup_ms: u64,
    /// Outstanding IOs per host, one row each.
    pub qds: Vec<u32>,
    pub target: TargetModel,
    pub ports: Vec<PortModel>,
    pub devices: Vec<DeviceGroup>,
    pub hosts: Vec<HostGroup>,
    /// One table per entry: a pacing config (and optional buffer count) to compare.
    pub runs: Vec<RunConfig>,
    /// Print each reactor's pacer state every simulated millisecond to
    /// stderr (`iopace sim --trace`): how the estimates move over a run.
    #[serde(skip)]
    pub trace: bool,
}

fn one_u64() -> u64 {
    1
}
fn default_duration() -> u64 {
    100
}
fn default_warmup() -> u64 {
    30
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub label: String,
    pub pacing: PacingConfig,
    /// Overrides the target's buffer count for this run.
    pub num_shared_buffers: Option<u32>,
    /// Overrides the target's reactor count for this run.
    #[serde(default)]
    pub reactors: Option<usize>,
    /// Overrides the target's per-reactor buffer cache for this run.
    #[serde(default)]
    pub buf_cache_size: Option<u32>,
    /// Overrides every host group's block-size split for this run.
    #[serde(default)]
    pub bssplit: Option<Vec<(u32, u32)>>,
    /// Overrides every host group's percentage of reads for this run.
    #[serde(default)]
    pub read_pct: Option<u32>,
    /// Latency targets for every NVMe device in this run (overrides the groups').
    #[serde(default)]
    pub qos: Option<QosConfig>,
    /// Overrides every host group's protocol for this run.
    #[serde(default)]
    pub protocol: Option<Protocol>,
    /// Rows measured on the SPDK pacing target with the same settings, printed
    /// beside the simulated ones:
    /// (qd, BW Gb/s, bufs MiB).
    #[serde(default)]
    pub seed_rows: Vec<(u32, f64, f64)>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetModel {
    pub reactors: usize,
    pub buffer_size: u32,
    pub num_shared_buffers: u32,
    /// Idle buffers each reactor may cache (the pool's `buf_cache_size`).
    #[serde(default)]
    pub buf_cache_size: u32,
    /// Small buffers for IOs of at most `small_buffer_size` bytes (the
    /// server's `[buffers]` settings; its defaults when absent).
    #[serde(default)]
    pub num_small_buffers: Option<u32>,
    #[serde(default)]
    pub small_buffer_size: Option<u32>,
    /// Bytes in buffers the caches hold before throughput degrades, MiB.
    pub ddio_budget_mib: f64,
    /// Throughput lost per doubling of bytes in flight past the budget.
    pub ddio_slope: f64,
    /// Least fraction of the port rate left however much is in flight.
    pub ddio_floor: f64,
    /// Wire bytes per payload byte (headers), for the WIRE BW column.
    #[serde(default = "default_wire_overhead")]
    pub wire_overhead: f64,
}

fn default_wire_overhead() -> f64 {
    1.063
}

/// One of the target's network ports (both directions).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortModel {
    /// Payload rate, Gb/s.
    pub rate_gbps: f64,
    pub rtt_us: f64,
    /// Optional step change: (time ms, new rate Gb/s).
    #[serde(default)]
    pub step: Option<(u64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Nvme,
    Delay,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroup {
    pub count: usize,
    pub kind: DeviceKind,
    /// Fixed latency added to every IO, us (the whole latency for delay devices).
    pub latency_us: f64,
    #[serde(default = "one_usize")]
    pub parallel: usize,
    #[serde(default)]
    pub cost: Option<CostModel>,
    /// Whether the pacer is told `cost` (default true). When false it
    /// assumes a data-centre NVMe drive, as a real target with no `[cost]`
    /// for a file or block device does, while the drive serves at `cost`.
    #[serde(default = "yes")]
    pub cost_known: bool,
    /// Latency targets (iocost's QoS) for each device of the group.
    #[serde(default)]
    pub qos: Option<QosConfig>,
}

fn yes() -> bool {
    true
}

fn one_usize() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostGroup {
    pub count: usize,
    /// (bytes, weight) pairs; fio's bssplit.
    pub bssplit: Vec<(u32, u32)>,
    /// Percent of IOs that are reads; the rest are writes (fio's rwmixread).
    #[serde(default = "all_reads")]
    pub read_pct: u32,
    /// Device indexes this host uses (default: all).
    #[serde(default)]
    pub devices: Vec<usize>,
    /// Multiplies the scenario QD for this group (e.g. 0 for idle).
    #[serde(default = "one_f64")]
    pub qd_scale: f64,
    /// Tenant index in the run's pacing config.
    #[serde(default)]
    pub tenant: usize,
    /// Fixed QD for this group regardless of the row.
    #[serde(default)]
    pub fixed_qd: Option<u32>,
    /// One connection per host (all its IO on one reactor), as an NBD client
    /// has; by default one per (host, device), spread as NVMe-oF qpairs are.
    #[serde(default)]
    pub one_connection: bool,
    /// The target port these hosts reach (default: hosts spread round robin).
    #[serde(default)]
    pub port: Option<usize>,
    /// Each host's own link, Gb/s of payload each way (default: as fast as
    /// its port); the host's bottleneck when slower than its share.
    #[serde(default)]
    pub link_gbps: Option<f64>,
    /// Each host's round-trip time, us (default: its port's).
    #[serde(default)]
    pub rtt_us: Option<f64>,
    /// The wire protocol its hosts speak: "nbd" (the default) or
    /// "nvme-tcp".
    #[serde(default)]
    pub protocol: Protocol,
}

impl Scenario {
    /// Whether some host speaks NVMe/TCP in `run`.
    pub fn speaks_nvme(&self, run: &RunConfig) -> bool {
        let nvme = |p| p == Protocol::NvmeTcp;
        run.protocol
            .map_or_else(|| self.hosts.iter().any(|g| nvme(g.protocol)), nvme)
    }
}

/// A host group's wire protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum Protocol {
    /// One NBD connection per (host, device), each to its export.
    #[default]
    #[serde(rename = "nbd")]
    Nbd,
    /// Per (host, device) a controller of the export's subsystem: an admin
    /// queue and one I/O queue, each its own connection; all of one
    /// host's queues name its host NQN.
    #[serde(rename = "nvme-tcp")]
    NvmeTcp,
}

fn one_f64() -> f64 {
    1.0
}
fn all_reads() -> u32 {
    100
}
