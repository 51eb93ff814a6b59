//! What a tune sweep measures and names: its points (each at one knob:
//! a vrate, a cap on the adversary's IOs at the device, or neither), the
//! solutions named from them, and the sweep's result.

use pace::pacer::{CostModel, IoKind};

use crate::driver::{JobStats, Workload};

/// vrates tried, in percent of the cost model's rate, highest first.
pub const VRATES: [f64; 12] = [
    200.0, 160.0, 130.0, 115.0, 100.0, 90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0,
];

/// Caps on the adversary's IOs at the device (`[qos] light_depth`) tried,
/// highest first: a cap bounds the queue the probe's IO finds, which a
/// budget does not, and costs only what the device's curve loses at that
/// depth (on a disk that serves many IOs at once, a cap of 8-16 kept the
/// probe within 2x solo at 79-100% of its rate, docs/evidence.md#tune-lone-depth).
/// Finer at the low end, where served through a busy reactor the probe
/// crossed its target between 4 and 8 (docs/evidence.md#tune-light-depth).
pub const DEPTHS: [u32; 8] = [32, 24, 16, 12, 10, 8, 6, 4];

/// What one point holds the adversary to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Knob {
    /// Nothing (served only: the server's own pacing, no `[qos]`).
    Untuned,
    /// A budget: vrate percent of the cost model's rate.
    Vrate(f64),
    /// A cap on its IOs at the device.
    Depth(u32),
}

impl Knob {
    /// The point's name: its saved file's stem and its served run's name.
    pub fn key(self) -> String {
        match self {
            Knob::Untuned => "untuned".into(),
            Knob::Vrate(v) => format!("vrate-{v:05.1}"),
            Knob::Depth(n) => format!("depth-{n:03}"),
        }
    }

    /// The knob that `p` was measured at.
    pub fn of(p: &TunePoint) -> Knob {
        match p.light_depth {
            Some(n) => Knob::Depth(n),
            None if p.vrate > 0.0 => Knob::Vrate(p.vrate),
            None => Knob::Untuned,
        }
    }
}

/// One vrate (or cap) point.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TunePoint {
    /// The vrate held, percent (0: none, untuned or a cap).
    pub vrate: f64,
    /// 4 KiB random read IOPS the budget allows at this vrate: in process
    /// the adversary's, served the device's (see [`TunePoint::budgeted_rate`]).
    #[serde(default)]
    pub budget_iops: f64,
    pub adversary: JobStats,
    pub probe: JobStats,
    /// The probe's p99 over its solo p99.
    pub isolation: f64,
    /// Served points: the vrate (percent) the server held.
    #[serde(default)]
    pub vrate_held: Option<f64>,
    /// Served points: the server's CPU per IO, us.
    #[serde(default)]
    pub cpu_us_per_io: Option<f64>,
    /// Served: the budget is the device's, and the probe's IOs take from
    /// it too (in process only the adversary is throttled).
    #[serde(default)]
    pub served: bool,
    /// A cap point: the adversary's IOs at the device were held to this
    /// many (served: `[qos] light_depth`; in process: its queue depth).
    #[serde(default)]
    pub light_depth: Option<u32>,
    /// Runs this point is the worst of (1 unless it was confirmed).
    #[serde(default = "one_run")]
    pub runs: u32,
}

fn one_run() -> u32 {
    1
}

impl TunePoint {
    /// The IOPS the budget paced: the adversary's, and served the probe's too.
    pub fn budgeted_rate(&self) -> f64 {
        self.adversary.rate + if self.served { self.probe.rate } else { 0.0 }
    }
}

/// A named solution and the `[qos.NAME]` it gives.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Solution {
    pub name: String,
    /// The vrate the solution holds (`[qos]` `min` = `max` = it): tune
    /// measured the device only at held vrates, and the QoS loop's latency
    /// target is the p99 of every read at the device, which it did not
    /// measure, so a solution names no target for the loop to chase.
    pub vrate: f64,
    /// A cap solution (`[qos]` `light_depth` = it, `vrate` 0: none held).
    #[serde(default)]
    pub light_depth: Option<u32>,
    /// The QD 1 probe's p99 the solution was chosen to keep (isolation).
    #[serde(default)]
    pub probe_target_us: Option<f64>,
    /// The probe's p99 measured at the point nearest the solution's vrate.
    #[serde(default)]
    pub probe_p99_us: Option<f64>,
    /// A cap solution's vrate for a controller without caps (iocost's): the
    /// isolation vrate of the sweep's vrate points.
    #[serde(default)]
    pub kernel_vrate: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TuneResult {
    pub device: String,
    /// The device number its iocost lines name, and how it was found.
    #[serde(default)]
    pub line_dev: Option<crate::cgroup::LineDev>,
    /// The device's model and firmware, for `probe db add`.
    #[serde(default)]
    pub identity: Option<bdev::identity::Identity>,
    pub cost: CostModel,
    pub solo: JobStats,
    pub points: Vec<TunePoint>,
    pub solutions: Vec<Solution>,
    pub elapsed_s: f64,
    pub command: String,
    /// Where the points were measured: "in process" or "served (nbd)".
    #[serde(default)]
    pub path: String,
    /// Served: the adversary and probe with no latency target.
    #[serde(default)]
    pub untuned: Option<TunePoint>,
    /// The cap points, highest cap first.
    #[serde(default)]
    pub depths: Vec<TunePoint>,
}

pub const fn rand4k() -> Workload {
    Workload {
        read_pct: 100,
        bs: 4096,
        random: true,
        alt_bs: None,
    }
}

/// IOPS of the adversary's 4 KiB random reads that `vrate` (percent) of
/// `cost`'s rate allows.
pub fn budget_iops(cost: CostModel, vrate: f64) -> f64 {
    vrate / 100.0 * 1e9 / cost.cost(IoKind::Read, rand4k().bs, false)
}

/// A point for tests: the adversary at `rate`, the probe's p99 `isolation`
/// times a solo p99 of 100 us.
#[cfg(test)]
pub(crate) fn test_point(vrate: f64, rate: f64, isolation: f64) -> TunePoint {
    let stats = |rate: f64, p99: f64| JobStats {
        rate,
        bytes_per_s: rate * 4096.0,
        p50_us: p99 / 2.0,
        p99_us: p99,
    };
    TunePoint {
        vrate,
        budget_iops: vrate * 292.0,
        adversary: stats(rate, 1.0),
        probe: stats(1.0, isolation * 100.0),
        isolation,
        vrate_held: None,
        cpu_us_per_io: None,
        served: false,
        light_depth: None,
        runs: 1,
    }
}
