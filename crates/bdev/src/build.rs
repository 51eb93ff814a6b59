//! Builds the config's bdev stacks into flat [`Bdev`]s: resolves `base`
//! references in any order (refusing cycles), checks each spec's fields,
//! plans the RAM of malloc bdevs, and opens files (or, checking only,
//! stands in for them).

use std::collections::HashMap;
use std::sync::Arc;

use crate::file::{self, FileLeaf};
use crate::memory::{self, Budget, MallocMem};
use crate::spec::{err, kind_name, DelaySpec, FaultSpec, Geometry, ModelSpec};
use crate::{
    Bdev, BdevKind, BdevSet, BdevSpec, BuildError, ByteSize, Caps, DelayModel, DirectMode, Fault,
    FaultParams, Leaf, ModelDevice, ModelParams,
};

/// Builds every bdev, resolving `base` references in any order.
pub fn build(specs: &[BdevSpec]) -> Result<BdevSet, BuildError> {
    build_as(specs, BuildMode::Serve)
}

/// Checks every bdev as [`build`] would, but creates, extends and maps
/// nothing: files and RAM are stood in for by null leaves of their size.
pub fn check(specs: &[BdevSpec]) -> Result<BdevSet, BuildError> {
    build_as(specs, BuildMode::Check)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BuildMode {
    Serve,
    Check,
}

fn build_as(specs: &[BdevSpec], mode: BuildMode) -> Result<BdevSet, BuildError> {
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        if s.name.is_empty() {
            return Err(err(i, "name", "must not be empty"));
        }
        if by_name.insert(&s.name, i).is_some() {
            return Err(err(i, "name", format!("duplicate bdev name `{}`", s.name)));
        }
    }
    let mut b = Builder {
        specs,
        mode,
        by_name,
        built: HashMap::new(),
        visiting: Vec::new(),
        ram: RamPlan {
            machine: memory::physical_ram(),
            ..RamPlan::default()
        },
    };
    let mut order = Vec::new();
    for i in 0..specs.len() {
        for bdev in b.resolve(i)? {
            order.push(bdev.name.clone());
        }
    }
    let mut bdevs = HashMap::new();
    for list in b.built.into_values() {
        for bdev in list {
            if bdevs.contains_key(&bdev.name) {
                let idx = specs.iter().position(|s| s.name == bdev.name).unwrap_or(0);
                return Err(err(
                    idx,
                    "name",
                    format!("bdev name `{}` is also a split part", bdev.name),
                ));
            }
            bdevs.insert(bdev.name.clone(), bdev);
        }
    }
    order.dedup();
    Ok(BdevSet { bdevs, order })
}

struct Builder<'a> {
    specs: &'a [BdevSpec],
    mode: BuildMode,
    by_name: HashMap<&'a str, usize>,
    /// Built bdevs per spec index (a split yields several).
    built: HashMap<usize, Vec<Arc<Bdev>>>,
    visiting: Vec<usize>,
    /// RAM of malloc bdevs: the machine's, the budget shared by those
    /// without `max_resident` (half of it), the sum of the others'.
    ram: RamPlan,
}

#[derive(Default)]
struct RamPlan {
    machine: u64,
    shared: Option<Arc<Budget>>,
    own: u64,
}

impl Builder<'_> {
    fn base_of(&mut self, i: usize) -> Result<Arc<Bdev>, BuildError> {
        let s = &self.specs[i];
        let Some(base) = s.base() else {
            let msg = format!("a {} bdev needs a base", kind_name(s.kind_name()));
            return Err(err(i, "base", msg));
        };
        // A split part "namepN" is found through its split's spec.
        let found = self.by_name.get(base).copied().or_else(|| {
            self.specs.iter().position(|o| {
                matches!(o.kind, BdevKind::Split { .. })
                    && base.starts_with(&o.name)
                    && base[o.name.len()..].starts_with('p')
            })
        });
        let Some(j) = found else {
            return Err(err(i, "base", format!("no bdev named `{base}`")));
        };
        let list = self.resolve_inner(j, i)?;
        list.into_iter()
            .find(|b| b.name == base)
            .ok_or_else(|| err(i, "base", format!("no bdev named `{base}`")))
    }

    fn resolve(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        self.resolve_inner(i, i)
    }

    fn resolve_inner(&mut self, i: usize, from: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        if let Some(b) = self.built.get(&i) {
            return Ok(b.clone());
        }
        if self.visiting.contains(&i) {
            return Err(err(
                from,
                "base",
                format!("bdev `{}` is part of a base cycle", self.specs[i].name),
            ));
        }
        self.visiting.push(i);
        let r = self.make(i);
        self.visiting.pop();
        let list = r?;
        self.built.insert(i, list.clone());
        Ok(list)
    }

    /// The RAM budget malloc bdev `i`'s written data draws on: its own
    /// `max_resident`, or half the machine's RAM shared by every malloc bdev
    /// without one. All of them together may not promise more than the
    /// machine has: past it, the OOM killer, not ENOSPC, would answer.
    fn malloc_budget(
        &mut self,
        i: usize,
        max_resident: Option<ByteSize>,
    ) -> Result<Arc<Budget>, BuildError> {
        let ram = &mut self.ram;
        // RAM unknown (sysconf failed): the shared budget is unbounded, not
        // zero, which would refuse every write.
        let half = match ram.machine {
            0 => u64::MAX,
            m => m / 2,
        };
        let budget = match max_resident {
            Some(ByteSize(0)) => return Err(err(i, "max_resident", "must be more than 0")),
            Some(ByteSize(n)) => {
                ram.own = ram.own.saturating_add(n);
                Budget::new(n)
            }
            None => ram.shared.get_or_insert_with(|| Budget::new(half)).clone(),
        };
        let shared = match &ram.shared {
            Some(_) if ram.machine > 0 => half,
            _ => 0,
        };
        if ram.machine > 0 && ram.own.saturating_add(shared) > ram.machine {
            let field = match max_resident {
                Some(_) => "max_resident",
                None => "size",
            };
            let msg = format!(
                "malloc bdevs would hold up to {} of data ({} by max_resident, {} shared by \
                 those without it), more than this machine's {} of RAM: lower max_resident",
                ByteSize(ram.own.saturating_add(shared)),
                ByteSize(ram.own),
                ByteSize(shared),
                ByteSize(ram.machine)
            );
            return Err(err(i, field, msg));
        }
        Ok(budget)
    }

    /// A model device over a null or malloc base, which holds the data.
    fn make_model(&mut self, i: usize, model: &ModelSpec) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let params = ModelParams::from_spec(model).map_err(|(f, m)| err(i, f, m))?;
        let base = self.base_of(i)?;
        if base.kind() == "file" || base.has_delay() {
            return Err(err(
                i,
                "base",
                format!(
                    "a model bdev needs a null or malloc base with no delay; `{}` is a {}{}",
                    base.name,
                    base.kind(),
                    if base.has_delay() {
                        " with a delay"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(vec![Arc::new(Bdev {
            name: self.specs[i].name.clone(),
            size: base.size,
            block_size: base.block_size,
            offset: base.offset,
            leaf: base.leaf.clone(),
            delays: Vec::new(),
            model: Some(Arc::new(ModelDevice::new(params))),
            faults: Vec::new(),
            caps: base.caps,
        })])
    }

    fn make(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let specs = self.specs;
        let s = &specs[i];
        let leaf = |leaf: Leaf, geometry: &Geometry, size: u64, caps: Caps| {
            let block_size = block_size_of(geometry, i)?;
            Ok(vec![leaf_bdev(s, block_size, leaf, size, caps)])
        };
        match &s.kind {
            BdevKind::Null { geometry, pattern } => {
                block_size_of(geometry, i)?;
                let size = sized(geometry, "null", i)?;
                let pattern = pattern.unwrap_or(0xA5);
                leaf(Leaf::Null { pattern }, geometry, size, MEM_CAPS)
            }
            // Checked as served: mapping costs address space, not RAM.
            BdevKind::Malloc {
                geometry,
                max_resident,
            } => {
                block_size_of(geometry, i)?;
                let size = sized(geometry, "malloc", i)?;
                let budget = self.malloc_budget(i, *max_resident)?;
                let mem = MallocMem::new(size, budget).map_err(|e| {
                    let msg = format!(
                        "cannot map {} of address space: {e} (a malloc bdev maps its \
                         whole size; 64 TiB is about the most a 47-bit address space takes)",
                        ByteSize(size)
                    );
                    err(i, "size", msg)
                })?;
                leaf(Leaf::Malloc(mem), geometry, size, MEM_CAPS)
            }
            BdevKind::File {
                geometry,
                path,
                direct,
            } => {
                block_size_of(geometry, i)?;
                let (file, size, caps) = self.file_leaf(i, geometry, path, *direct)?;
                leaf(file, geometry, size, caps)
            }
            BdevKind::Split { parts, .. } => self.make_split(i, *parts),
            BdevKind::Delay { delay, .. } => self.make_delay(i, delay),
            BdevKind::Model { model, .. } => self.make_model(i, model),
            BdevKind::Fault { fault, .. } => self.make_fault(i, fault),
        }
    }

    /// A file bdev's leaf (a null stand-in when only checking), size and caps.
    fn file_leaf(
        &self,
        i: usize,
        geometry: &Geometry,
        path: &str,
        direct: DirectMode,
    ) -> Result<(Leaf, u64, Caps), BuildError> {
        let size = geometry.size.map(|b| b.0);
        if let Some(n) = size {
            within_max_size(n, i)?;
        }
        if let Some(current) = file::larger_than(path, size) {
            return Err(err(
                i,
                "size",
                format!("{path} has {current} bytes, more than size: raise size or remove it"),
            ));
        }
        let leaf = match self.mode {
            BuildMode::Check => file::planned_size(path, size).map(|size| {
                let read_only = crate::file_access::only_readable(path);
                (
                    Leaf::Null { pattern: 0 },
                    size,
                    Caps {
                        read_only,
                        ..MEM_CAPS
                    },
                )
            }),
            BuildMode::Serve => FileLeaf::open(path, size, direct).map(|f| {
                let (size, caps) = (f.size(), f.caps());
                (Leaf::File(f), size, caps)
            }),
        };
        let (leaf, size, caps) = leaf.map_err(|e| err(i, "path", format!("{path}: {e}")))?;
        // Served to its last byte, whole blocks or not (NBD sizes are
        // bytes): rounding down would hide the tail of an image cut
        // anywhere. Only the parts of a split are whole blocks.
        if size == 0 {
            return Err(err(
                i,
                "size",
                format!("{path} is empty: give a size to create it"),
            ));
        }
        Ok((leaf, size, caps))
    }

    fn make_split(&mut self, i: usize, parts: Option<u32>) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let parts = match parts {
            Some(p) if (1..=MAX_PARTS).contains(&p) => p,
            _ => {
                let msg = format!("a split bdev needs parts from 1 to {MAX_PARTS}");
                return Err(err(i, "parts", msg));
            }
        };
        let base = self.base_of(i)?;
        let bs = u64::from(base.block_size);
        let part = base.size / u64::from(parts) / bs * bs;
        if part == 0 {
            return Err(err(
                i,
                "parts",
                format!("{parts} parts of {} bytes leave nothing", base.size),
            ));
        }
        let name = &self.specs[i].name;
        Ok((0..parts)
            .map(|p| {
                Arc::new(Bdev {
                    name: format!("{name}p{p}"),
                    size: part,
                    offset: base.offset + u64::from(p) * part,
                    ..(*base).clone()
                })
            })
            .collect())
    }

    fn make_delay(&mut self, i: usize, s: &DelaySpec) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let base = self.base_of(i)?;
        let read_avg = s.read_avg_us.unwrap_or(0);
        let write_avg = s.write_avg_us.unwrap_or(0);
        let model = DelayModel::new(
            read_avg,
            s.read_p99_us.unwrap_or(read_avg),
            write_avg,
            s.write_p99_us.unwrap_or(write_avg),
        )
        .map_err(|(field, m)| err(i, field, m))?;
        let mut delays = base.delays.clone();
        delays.push(model);
        Ok(vec![Arc::new(Bdev {
            name: self.specs[i].name.clone(),
            delays,
            ..(*base).clone()
        })])
    }
}

impl Builder<'_> {
    fn make_fault(&mut self, i: usize, s: &FaultSpec) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let base = self.base_of(i)?;
        let name = &self.specs[i].name;
        let d = FaultParams::default();
        let params = FaultParams {
            ops: s.ops.clone().unwrap_or(d.ops),
            errno: s.errno.unwrap_or(d.errno),
            error_rate: s.error_rate.unwrap_or(d.error_rate),
            fail_range: s.fail_range,
            fail_after: s.fail_after,
            latency_us: s.latency_us.unwrap_or(d.latency_us),
            spike_us: s.spike_us.unwrap_or(d.spike_us),
            spike_rate: s.spike_rate.unwrap_or(d.spike_rate),
            stall: s.stall.unwrap_or(d.stall),
            stall_ms: s.stall_ms.unwrap_or(d.stall_ms),
        };
        params.check().map_err(|(f, m)| err(i, f, m))?;
        if let Some(r) = params.fail_range {
            if r.offset.0 >= base.size {
                let msg = format!(
                    "offset {} is past the end ({} bytes)",
                    r.offset.0, base.size
                );
                return Err(err(i, "fail_range", msg));
            }
        }
        let mut faults = base.faults.clone();
        faults.push(Arc::new(Fault::new(name, base.offset, params)));
        Ok(vec![Arc::new(Bdev {
            name: name.clone(),
            faults,
            ..(*base).clone()
        })])
    }
}

/// Most parts of one split: each is a bdev of its own, built at start
/// (4 billion of them took the machine's memory).
pub const MAX_PARTS: u32 = 4096;

/// RAM-like leaves (null, malloc, a checked file) do everything at once.
const MEM_CAPS: Caps = Caps {
    flush: true,
    fua: true,
    trim: true,
    write_zeroes: true,
    fast_zero: true,
    rotational: false,
    read_only: false,
};

fn block_size_of(geometry: &Geometry, i: usize) -> Result<u32, BuildError> {
    match geometry.block_size {
        None => Ok(512),
        Some(ByteSize(b)) if (512..=65536).contains(&b) && b.is_power_of_two() => Ok(b as u32),
        Some(b) => Err(err(
            i,
            "block_size",
            format!("must be a power of two from 512 to 64 KiB, got {b}"),
        )),
    }
}

/// Largest export: NBD clients take sizes up to 2^63 - 1 (qemu and the
/// kernel keep offsets in signed 64 bits), as file offsets are.
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// The spec's size, exact to the byte as a file bdev's (NBD sizes are
/// bytes; rounding would hide a tail the config asked for): 1 byte up to
/// [`MAX_SIZE`].
fn sized(geometry: &Geometry, kind: &str, i: usize) -> Result<u64, BuildError> {
    match geometry.size {
        Some(ByteSize(0)) => Err(err(i, "size", "must be at least 1 byte")),
        Some(ByteSize(n)) => within_max_size(n, i),
        None => Err(err(i, "size", format!("a {kind} bdev needs a size"))),
    }
}

/// `n`, if no larger than [`MAX_SIZE`].
fn within_max_size(n: u64, i: usize) -> Result<u64, BuildError> {
    if n > MAX_SIZE {
        let msg =
            format!("{n} bytes is more than 2^63 - 1 ({MAX_SIZE}), the most NBD clients take");
        return Err(err(i, "size", msg));
    }
    Ok(n)
}

fn leaf_bdev(s: &BdevSpec, block_size: u32, leaf: Leaf, size: u64, caps: Caps) -> Arc<Bdev> {
    Arc::new(Bdev {
        name: s.name.clone(),
        size,
        block_size,
        offset: 0,
        leaf: Arc::new(leaf),
        delays: Vec::new(),
        model: None,
        faults: Vec::new(),
        caps,
    })
}
