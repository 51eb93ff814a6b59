//! A bdev as the config gives it ([`BdevTable`]: `[[bdev]]` with a name, a
//! kind and fields, flat) and as the code uses it ([`BdevSpec`]: one
//! variant per kind, with that kind's fields). A field another kind takes
//! is an error, naming the field.

use crate::{ByteSize, Errno, FailRange, FaultOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BdevKindName {
    Null,
    Malloc,
    File,
    Split,
    Delay,
    Model,
    Fault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectMode {
    /// O_DIRECT for aligned IO where the filesystem supports it.
    #[default]
    Auto,
    On,
    Off,
}

/// `[[bdev]]` as the config file has it: a name, a kind, and the fields of
/// every kind, flat, as users write them. [`BdevTable::spec`] checks them
/// into the typed [`BdevSpec`] the rest of the code uses; a field its kind
/// does not take is an error there, naming the field.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevTable {
    pub name: String,
    pub kind: BdevKindName,
    pub base: Option<String>,
    pub size: Option<ByteSize>,
    pub block_size: Option<ByteSize>,
    /// Malloc bdevs: most RAM their written data may take (default: they
    /// share half the machine's RAM); a write past it fails with ENOSPC.
    pub max_resident: Option<ByteSize>,
    pub path: Option<String>,
    pub direct: Option<DirectMode>,
    pub parts: Option<u32>,
    pub pattern: Option<u8>,
    pub read_avg_us: Option<u64>,
    pub read_p99_us: Option<u64>,
    pub write_avg_us: Option<u64>,
    pub write_p99_us: Option<u64>,
    /// Model bdevs: the linear cost model they deliver.
    pub cost: Option<types::CostModel>,
    /// Model bdevs: fixed latency of every IO.
    pub latency_us: Option<f64>,
    /// Model bdevs: IOs served at once.
    pub channels: Option<u32>,
    /// Model bdevs: in-flight IOs past which latency grows by `knee_us` each.
    pub knee_qd: Option<u32>,
    pub knee_us: Option<f64>,
    /// Fault bdevs (see [`FaultParams`]); `latency_us` too.
    pub ops: Option<Vec<FaultOp>>,
    pub errno: Option<Errno>,
    pub error_rate: Option<f64>,
    pub fail_range: Option<FailRange>,
    pub fail_after: Option<u64>,
    pub spike_us: Option<f64>,
    pub spike_rate: Option<f64>,
    pub stall: Option<bool>,
    pub stall_ms: Option<u64>,
}

impl BdevTable {
    /// A table with only name and kind set, for tests.
    pub fn new(name: &str, kind: BdevKindName) -> BdevTable {
        BdevTable {
            name: name.to_string(),
            kind,
            base: None,
            size: None,
            block_size: None,
            max_resident: None,
            path: None,
            direct: None,
            parts: None,
            pattern: None,
            read_avg_us: None,
            read_p99_us: None,
            write_avg_us: None,
            write_p99_us: None,
            cost: None,
            latency_us: None,
            channels: None,
            knee_qd: None,
            knee_us: None,
            ops: None,
            errno: None,
            error_rate: None,
            fail_range: None,
            fail_after: None,
            spike_us: None,
            spike_rate: None,
            stall: None,
            stall_ms: None,
        }
    }
}

/// One bdev, typed: its name and what its kind takes.
#[derive(Debug, Clone)]
pub struct BdevSpec {
    pub name: String,
    pub kind: BdevKind,
}

/// Each kind with its own fields: leaves (null, malloc, file) have a size;
/// layers (split, delay, model, fault) sit on a `base`.
#[derive(Debug, Clone)]
pub enum BdevKind {
    Null {
        geometry: Geometry,
        /// The byte every READ returns.
        pattern: Option<u8>,
    },
    Malloc {
        geometry: Geometry,
        /// Most RAM its written data may take (default: malloc bdevs share
        /// half the machine's RAM); a write past it fails with ENOSPC.
        max_resident: Option<ByteSize>,
    },
    File {
        geometry: Geometry,
        path: String,
        direct: DirectMode,
    },
    Split {
        base: String,
        parts: Option<u32>,
    },
    Delay {
        base: String,
        delay: DelaySpec,
    },
    Model {
        base: String,
        model: ModelSpec,
    },
    Fault {
        base: String,
        fault: FaultSpec,
    },
}

/// A leaf's size (a file's may be absent: the file's own) and block size
/// (default 512).
#[derive(Debug, Clone, Copy, Default)]
pub struct Geometry {
    pub size: Option<ByteSize>,
    pub block_size: Option<ByteSize>,
}

impl Geometry {
    pub fn sized(bytes: u64) -> Geometry {
        Geometry {
            size: Some(ByteSize(bytes)),
            block_size: None,
        }
    }
}

/// A delay layer's latencies, microseconds (p99 defaults to the average).
#[derive(Debug, Clone, Copy, Default)]
pub struct DelaySpec {
    pub read_avg_us: Option<u64>,
    pub read_p99_us: Option<u64>,
    pub write_avg_us: Option<u64>,
    pub write_p99_us: Option<u64>,
}

/// A model device (see [`ModelParams`](crate::ModelParams)).
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelSpec {
    /// The linear cost model it delivers.
    pub cost: Option<types::CostModel>,
    /// Fixed latency of every IO.
    pub latency_us: Option<f64>,
    /// IOs served at once.
    pub channels: Option<u32>,
    /// In-flight IOs past which latency grows by `knee_us` each.
    pub knee_qd: Option<u32>,
    pub knee_us: Option<f64>,
}

/// A fault layer (see [`FaultParams`](crate::FaultParams)): unset fields
/// take its defaults.
#[derive(Debug, Clone, Default)]
pub struct FaultSpec {
    pub ops: Option<Vec<FaultOp>>,
    pub errno: Option<Errno>,
    pub error_rate: Option<f64>,
    pub fail_range: Option<FailRange>,
    pub fail_after: Option<u64>,
    pub latency_us: Option<f64>,
    pub spike_us: Option<f64>,
    pub spike_rate: Option<f64>,
    pub stall: Option<bool>,
    pub stall_ms: Option<u64>,
}

impl BdevSpec {
    /// The base it sits on: none for a leaf.
    pub fn base(&self) -> Option<&str> {
        match &self.kind {
            BdevKind::Null { .. } | BdevKind::Malloc { .. } | BdevKind::File { .. } => None,
            BdevKind::Split { base, .. }
            | BdevKind::Delay { base, .. }
            | BdevKind::Model { base, .. }
            | BdevKind::Fault { base, .. } => Some(base),
        }
    }

    pub fn kind_name(&self) -> BdevKindName {
        match &self.kind {
            BdevKind::Null { .. } => BdevKindName::Null,
            BdevKind::Malloc { .. } => BdevKindName::Malloc,
            BdevKind::File { .. } => BdevKindName::File,
            BdevKind::Split { .. } => BdevKindName::Split,
            BdevKind::Delay { .. } => BdevKindName::Delay,
            BdevKind::Model { .. } => BdevKindName::Model,
            BdevKind::Fault { .. } => BdevKindName::Fault,
        }
    }
}

/// A spec that cannot be built: which one, which field, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    pub index: usize,
    pub field: &'static str,
    pub message: String,
}

pub(crate) fn err(index: usize, field: &'static str, message: impl Into<String>) -> BuildError {
    BuildError {
        index,
        field,
        message: message.into(),
    }
}

impl BdevTable {
    /// The typed spec of the `index`-th `[[bdev]]`, or what is wrong with
    /// it: a field its kind does not take, or a base or path it needs.
    pub fn spec(&self, index: usize) -> Result<BdevSpec, BuildError> {
        check_fields(self, index)?;
        let geometry = Geometry {
            size: self.size,
            block_size: self.block_size,
        };
        let kind = match self.kind {
            BdevKindName::Null => BdevKind::Null {
                geometry,
                pattern: self.pattern,
            },
            BdevKindName::Malloc => BdevKind::Malloc {
                geometry,
                max_resident: self.max_resident,
            },
            BdevKindName::File => BdevKind::File {
                geometry,
                path: self
                    .path
                    .clone()
                    .ok_or_else(|| err(index, "path", "a file bdev needs a path"))?,
                direct: self.direct.unwrap_or_default(),
            },
            _ => self.layer(index)?,
        };
        Ok(BdevSpec {
            name: self.name.clone(),
            kind,
        })
    }

    /// A layer's kind: its base and its own fields.
    fn layer(&self, index: usize) -> Result<BdevKind, BuildError> {
        let base = self.base.clone().ok_or_else(|| {
            let msg = format!("a {} bdev needs a base", kind_name(self.kind));
            err(index, "base", msg)
        })?;
        Ok(match self.kind {
            BdevKindName::Null | BdevKindName::Malloc | BdevKindName::File => {
                unreachable!("leaves are not layers")
            }
            BdevKindName::Split => BdevKind::Split {
                base,
                parts: self.parts,
            },
            BdevKindName::Delay => BdevKind::Delay {
                base,
                delay: DelaySpec {
                    read_avg_us: self.read_avg_us,
                    read_p99_us: self.read_p99_us,
                    write_avg_us: self.write_avg_us,
                    write_p99_us: self.write_p99_us,
                },
            },
            BdevKindName::Model => BdevKind::Model {
                base,
                model: ModelSpec {
                    cost: self.cost,
                    latency_us: self.latency_us,
                    channels: self.channels,
                    knee_qd: self.knee_qd,
                    knee_us: self.knee_us,
                },
            },
            BdevKindName::Fault => BdevKind::Fault {
                base,
                fault: FaultSpec {
                    ops: self.ops.clone(),
                    errno: self.errno,
                    error_rate: self.error_rate,
                    fail_range: self.fail_range,
                    fail_after: self.fail_after,
                    latency_us: self.latency_us,
                    spike_us: self.spike_us,
                    spike_rate: self.spike_rate,
                    stall: self.stall,
                    stall_ms: self.stall_ms,
                },
            },
        })
    }
}

/// The typed specs of every `[[bdev]]`, or the first error.
pub fn specs(tables: &[BdevTable]) -> Result<Vec<BdevSpec>, BuildError> {
    tables.iter().enumerate().map(|(i, t)| t.spec(i)).collect()
}

/// A field set that the bdev's kind does not use is an error, not ignored:
/// `size` on a split or `max_resident` on a null says the config means
/// something it does not get.
fn check_fields(s: &BdevTable, i: usize) -> Result<(), BuildError> {
    use BdevKindName::*;
    let set = [
        ("base", s.base.is_some(), &[Split, Delay, Model, Fault][..]),
        ("size", s.size.is_some(), &[Null, Malloc, File]),
        ("block_size", s.block_size.is_some(), &[Null, Malloc, File]),
        ("max_resident", s.max_resident.is_some(), &[Malloc]),
        ("path", s.path.is_some(), &[File]),
        ("direct", s.direct.is_some(), &[File]),
        ("parts", s.parts.is_some(), &[Split]),
        ("pattern", s.pattern.is_some(), &[Null]),
        ("read_avg_us", s.read_avg_us.is_some(), &[Delay]),
        ("read_p99_us", s.read_p99_us.is_some(), &[Delay]),
        ("write_avg_us", s.write_avg_us.is_some(), &[Delay]),
        ("write_p99_us", s.write_p99_us.is_some(), &[Delay]),
        ("cost", s.cost.is_some(), &[Model]),
        ("latency_us", s.latency_us.is_some(), &[Model, Fault]),
        ("channels", s.channels.is_some(), &[Model]),
        ("knee_qd", s.knee_qd.is_some(), &[Model]),
        ("knee_us", s.knee_us.is_some(), &[Model]),
        ("ops", s.ops.is_some(), &[Fault]),
        ("errno", s.errno.is_some(), &[Fault]),
        ("error_rate", s.error_rate.is_some(), &[Fault]),
        ("fail_range", s.fail_range.is_some(), &[Fault]),
        ("fail_after", s.fail_after.is_some(), &[Fault]),
        ("spike_us", s.spike_us.is_some(), &[Fault]),
        ("spike_rate", s.spike_rate.is_some(), &[Fault]),
        ("stall", s.stall.is_some(), &[Fault]),
        ("stall_ms", s.stall_ms.is_some(), &[Fault]),
    ];
    match set
        .iter()
        .find(|(_, given, kinds)| *given && !kinds.contains(&s.kind))
    {
        Some((field, _, kinds)) => {
            let takers: Vec<&str> = kinds.iter().map(|k| kind_name(*k)).collect();
            Err(err(
                i,
                field,
                format!(
                    "a {} bdev has no `{field}` (only {} bdevs do)",
                    kind_name(s.kind),
                    takers.join(", ")
                ),
            ))
        }
        None => Ok(()),
    }
}

pub(crate) fn kind_name(k: BdevKindName) -> &'static str {
    match k {
        BdevKindName::Null => "null",
        BdevKindName::Malloc => "malloc",
        BdevKindName::File => "file",
        BdevKindName::Split => "split",
        BdevKindName::Delay => "delay",
        BdevKindName::Model => "model",
        BdevKindName::Fault => "fault",
    }
}
