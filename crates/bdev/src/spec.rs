//! A bdev as the config gives it: `[[bdev]]` with a name, a kind and the
//! fields of that kind; a field another kind takes is an error.

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

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevSpec {
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

impl BdevSpec {
    /// A spec with only name and kind set, for tests and programmatic use.
    pub fn new(name: &str, kind: BdevKindName) -> BdevSpec {
        BdevSpec {
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

/// A field set that the bdev's kind does not use is an error, not ignored:
/// `size` on a split or `max_resident` on a null says the config means
/// something it does not get.
pub(crate) fn check_fields(s: &BdevSpec, i: usize) -> Result<(), BuildError> {
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
