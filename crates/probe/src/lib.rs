//! `iopace probe`: know a device. It measures, on iopace's own bdev path,
//! the six parameters of the linear cost model (each point at the QD where
//! its rate peaks, [`qd_search`], in rounds taken in turn), IOPS and
//! latency against queue depth, the knee, scaling over threads and
//! devices, and "% of spec"; it writes report.md with plots, result.json,
//! a `[cost.NAME]` snippet and Linux iocost's `io.cost.model` line
//! ([`iocost`], [`cgroup`]). `iopace tune` ([`tune`]) finds the QoS.

pub mod cgroup;
pub mod converge;
pub mod db;
pub mod driver;
pub mod fit;
pub mod hwdb;
pub mod iocost;
pub mod known;
pub mod measurer;
pub mod plan;
pub mod qd_search;
pub mod report;
pub mod rounds;
pub mod run;
pub mod safety;
pub mod served;
pub mod solve;
pub mod spec;
pub mod tune;
pub mod tune_point;
pub mod tune_report;
pub mod tune_store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bdev::{Bdev, BdevKind, BdevSpec, ByteSize, DirectMode, Geometry};
use pace::pacer::CostModel;

use bdev::identity::{self, Identity};
use converge::StopRule;
use driver::Measurement;
use rounds::RoundCount;

pub use run::probe;

#[derive(Debug)]
pub enum ProbeError {
    /// Bad input (unknown device, refused path, bad spec): exit status 2.
    Usage(String),
    /// Running failed: exit status 1.
    Run(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Usage(e) | ProbeError::Run(e) => write!(f, "{e}"),
        }
    }
}

/// What `iopace probe` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bdev names of `config`, or paths of block devices and files.
    pub targets: Vec<String>,
    pub config: Option<PathBuf>,
    pub spec: Option<PathBuf>,
    pub out: PathBuf,
    /// Paths whose data may be destroyed by write measurements.
    pub destructive: Vec<PathBuf>,
    /// Short points and QD up to 64: for model devices and tests.
    pub quick: bool,
    /// Highest QD of the curves.
    pub max_qd: u32,
    /// Most worker threads of the scaling runs.
    pub threads: u32,
    /// Rounds of the alternated points (cost, datasheet, held-out); 0: the
    /// default ([`Options::round_count`]: 4 to 10, 3 in quick mode, a
    /// median against a moment the busy machine held the probe).
    pub rounds: u32,
    pub command: String,
    /// The MAJ:MIN the iocost lines name, instead of the device's own (one target only).
    pub devnum: Option<iocost::DevNum>,
}

impl Options {
    pub fn rule(&self) -> StopRule {
        if self.quick {
            StopRule::quick()
        } else {
            StopRule::device()
        }
    }

    /// How many rounds the alternated points take: `--rounds N` exactly;
    /// else 3 in quick mode, and in full mode 4 to 10, until every cost
    /// point's rounds agree within the rule's ±ci, but for one round off by
    /// itself ([`rounds::agree`]: a steady device stops at 4, one that
    /// drifts takes all 10).
    pub fn round_count(&self) -> RoundCount {
        let ci = self.rule().ci;
        match (self.rounds, self.quick) {
            (0, true) => RoundCount::fixed(3, ci),
            (0, false) => RoundCount {
                min: 4,
                max: 10,
                ci,
            },
            (n, _) => RoundCount::fixed(n, ci),
        }
    }

    /// A round of an alternated point. With several rounds, each is short
    /// and of fixed length (five windows): the points take turns often, so
    /// a disk whose rate drifts over seconds drifts under all of them alike,
    /// and the rounds, not the windows, are the samples of the point.
    pub fn round_rule(&self) -> StopRule {
        let rule = self.rule();
        if self.round_count().max > 1 {
            StopRule {
                warmup: rule.warmup.min(rule.window),
                min_windows: 5,
                cap: rule.window * 5,
                ..rule
            }
        } else {
            rule
        }
    }
}

/// A device to probe, opened.
pub struct Target {
    pub name: String,
    pub bdev: Arc<Bdev>,
    pub identity: Identity,
    /// Why writes are not measured, if they are not.
    pub write_refusal: Option<String>,
    /// The device number its iocost lines name.
    pub line_dev: cgroup::LineDev,
}

/// One point of a curve.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub x: u32,
    pub m: Measurement,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Curve {
    pub label: String,
    pub workload: driver::Workload,
    pub points: Vec<Point>,
    pub knee_qd: Option<u32>,
}

/// A held-out workload: what the cost model predicts against what it does.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prediction {
    pub workload: driver::Workload,
    pub qd: u32,
    /// At its QD: `fit::iops_at_qd` of `capacity_iops` and `unloaded_us`.
    pub predicted_iops: f64,
    /// One over the mean device time of an IO under the cost model as
    /// measured (its points at their QD): the prediction before QD counted.
    #[serde(default)]
    pub linear_iops: f64,
    /// The same under the cost points taken to saturation.
    #[serde(default)]
    pub capacity_iops: f64,
    /// The mean latency of the mix's IOs alone (QD 1 lines); 0: not measured.
    #[serde(default)]
    pub unloaded_us: f64,
    pub measured: Measurement,
}

/// Everything measured on one device.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceResult {
    pub name: String,
    pub identity: Identity,
    pub cost: CostModel,
    /// The cost, datasheet and held-out points: label, workload, QD and
    /// measurement (the median of its rounds).
    pub cost_points: Vec<plan::Row>,
    /// Each of those points' IOPS in every round, in the order measured.
    #[serde(default)]
    pub round_iops: Vec<plan::Rounds>,
    /// Each cost point's search for the QD where its rate peaks.
    #[serde(default)]
    pub qd_search: Vec<qd_search::Trace>,
    pub write_refusal: Option<String>,
    /// The device number its iocost lines name, and how it was found.
    #[serde(default)]
    pub line_dev: Option<cgroup::LineDev>,
    pub curves: Vec<Curve>,
    pub thread_scaling: Vec<Point>,
    /// The held-out mixes: what the cost model predicts against what they did.
    #[serde(default)]
    pub predictions: Vec<Prediction>,
    pub spec: Option<Vec<spec::SpecRow>>,
    /// Seconds to the cost model (its points and the held-out mixes, every round).
    #[serde(default)]
    pub cost_s: f64,
    pub elapsed_s: f64,
    /// Where those seconds went.
    #[serde(default)]
    pub phases: Phases,
}

/// Where a probe of one device spent its time, in seconds of each phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Phases {
    /// The cost points' peak searches.
    pub search_s: f64,
    /// The alternated points' rounds.
    pub rounds_s: f64,
    /// Rounds taken (the same for every alternated point).
    pub rounds: u32,
    /// The QD curves.
    pub curves_s: f64,
    /// Scaling over threads.
    pub scaling_s: f64,
    /// Curve and scaling points not measured again: an earlier phase had
    /// measured the same workload at the same QD.
    pub reused: u32,
}

/// Several devices at once against the sum of each alone.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MultiDevice {
    pub devices: Vec<String>,
    pub sum_alone_iops: f64,
    pub together: Measurement,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeResult {
    pub command: String,
    pub machine: String,
    pub quick: bool,
    pub devices: Vec<DeviceResult>,
    pub multi: Option<MultiDevice>,
}

/// Opens every target: bdevs of the config by name, or paths as file bdevs.
pub fn open_targets(opts: &Options) -> Result<Vec<Target>, ProbeError> {
    let set = match &opts.config {
        Some(path) => {
            let loaded = config::Config::load(Some(path))
                .map_err(|e| ProbeError::Usage(format!("config error: {e}")))?;
            let set = bdev::build(&loaded.bdevs).map_err(|e| {
                ProbeError::Usage(format!(
                    "config error: {}",
                    loaded.error_at("bdev", e.index, e.field, e.message.clone())
                ))
            })?;
            Some((loaded, set))
        }
        None => None,
    };
    let mut targets = Vec::new();
    for name in &opts.targets {
        let from_config = set.as_ref().and_then(|(l, s)| Some((l, s.get(name)?)));
        let target = match from_config {
            Some((loaded, bdev)) => config_target(name, bdev, loaded, opts)?,
            None => path_target(name, opts)?,
        };
        targets.push(target);
    }
    if let Some(dev) = opts.devnum {
        if targets.len() != 1 {
            return Err(ProbeError::Usage(
                "--devnum names the device of one target; give one".into(),
            ));
        }
        for t in &mut targets {
            t.line_dev = cgroup::LineDev::given(dev);
        }
    }
    Ok(targets)
}

fn config_target(
    name: &str,
    bdev: Arc<Bdev>,
    loaded: &config::LoadedConfig,
    opts: &Options,
) -> Result<Target, ProbeError> {
    let specs = &loaded.bdevs;
    let identity = config::cost_db::identity_of(specs, name, &bdev);
    // A config bdev over a file is that file's data: the same rules as a path.
    let (write_refusal, line_dev) = match config::cost_db::leaf_path(specs, name) {
        Some(path) if bdev.kind() == "file" => (
            write_refusal(safety::check_writes(Path::new(&path), &opts.destructive))?,
            cgroup::of_path(Path::new(&path)),
        ),
        _ => (None, cgroup::of_bdev(name, bdev.kind())),
    };
    Ok(Target {
        name: name.to_string(),
        bdev,
        identity,
        write_refusal,
        line_dev,
    })
}

/// Reads only when the path is not named; an error when it is unsafe.
fn write_refusal(w: safety::Writes) -> Result<Option<String>, ProbeError> {
    match w {
        safety::Writes::Allowed => Ok(None),
        safety::Writes::NotNamed(why) => Ok(Some(why)),
        safety::Writes::Unsafe(why) => Err(ProbeError::Usage(why)),
    }
}

fn path_target(name: &str, opts: &Options) -> Result<Target, ProbeError> {
    let path = Path::new(name);
    if !path.exists() {
        let hint = if opts.config.is_some() {
            "neither a bdev of the config nor an existing path"
        } else {
            "no such block device or file (or give --config with a bdev of that name)"
        };
        return Err(ProbeError::Usage(format!("{name}: {hint}")));
    }
    let spec = BdevSpec {
        name: "probe".into(),
        kind: BdevKind::File {
            geometry: Geometry {
                size: None,
                block_size: Some(ByteSize(4096)),
            },
            path: name.to_string(),
            direct: DirectMode::Auto,
        },
    };
    let set =
        bdev::build(&[spec]).map_err(|e| ProbeError::Usage(format!("{name}: {}", e.message)))?;
    let bdev = set
        .get("probe")
        .ok_or_else(|| ProbeError::Run(format!("{name}: not built")))?;
    Ok(Target {
        name: name.to_string(),
        identity: identity::of_path(path, &bdev),
        write_refusal: write_refusal(safety::check_writes(path, &opts.destructive))?,
        line_dev: cgroup::of_path(path),
        bdev,
    })
}

/// The device's `io.cost.model` line: its cost model, rounded, for the
/// device number of its target (a placeholder if none was found).
pub fn model_line(d: &DeviceResult) -> iocost::ModelLine {
    iocost::ModelLine {
        dev: d
            .line_dev
            .as_ref()
            .map_or(iocost::DevNum::PLACEHOLDER, |l| l.dev),
        ctrl: iocost::Ctrl::User,
        params: iocost::ModelParams::of(&d.cost),
    }
}
