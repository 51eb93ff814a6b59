//! Block devices: null, malloc, file (io_uring), split, delay, fault and model.
//!
//! A stack (delay over split over file, ...) is resolved at build time into a
//! flat [`Bdev`]: one leaf, a byte offset and the delay layers. This crate
//! owns no ring: file IO is returned as io_uring SQEs for the reactor to
//! submit, memory IO completes synchronously, and delays are sampled here but
//! applied by the reactor's timers, so no thread ever sleeps for an IO.

use std::collections::HashMap;
use std::sync::Arc;

mod delay;
mod fault;
mod file;
pub mod identity;
mod memory;
mod model;
mod size;

pub use delay::DelayModel;
pub use fault::{Errno, FailRange, Fault, FaultOp, FaultParams, FaultStatus, STALL_RECHECK_NS};
pub use model::{ModelDevice, ModelParams, ModelState};
pub use size::ByteSize;

pub use file::thin_shortfall;
use file::FileLeaf;
use memory::{Budget, MallocMem};

/// Backends fail with NBD error values, from the protocol's one table.
pub use proto::{EINVAL, EIO, ENOSPC, ENOTSUP};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    pub flush: bool,
    pub fua: bool,
    pub trim: bool,
    pub write_zeroes: bool,
    pub fast_zero: bool,
    pub rotational: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write {
        fua: bool,
    },
    Flush,
    Trim {
        fua: bool,
    },
    /// `fast`: NBD_CMD_FLAG_FAST_ZERO: fail with ENOTSUP rather than
    /// write zeros.
    WriteZeroes {
        may_trim: bool,
        fua: bool,
        fast: bool,
    },
    Cache,
}

impl IoOp {
    pub fn is_write(self) -> bool {
        matches!(
            self,
            IoOp::Write { .. } | IoOp::Trim { .. } | IoOp::WriteZeroes { .. }
        )
    }
}

/// One IO. `iov` must stay valid (and unmoved) until the IO completes.
#[derive(Debug, Clone, Copy)]
pub struct IoRequest {
    pub op: IoOp,
    /// Relative to the bdev.
    pub offset: u64,
    pub len: u32,
    pub iov: *const libc::iovec,
    pub iovcnt: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoResult {
    Ok,
    /// An NBD error value (EIO, ENOSPC, ...).
    Err(u32),
}

/// How the caller proceeds with an IO.
pub enum Prep {
    /// Already done (memory bdevs).
    Done(IoResult),
    /// Submit these in order, all but the last linked to the next. Each
    /// completes; after one fails (or is short), the rest complete with
    /// -ECANCELED. The IO's result is the first error, else the last's.
    Sqes(Vec<io_uring::squeue::Entry>),
}

pub(crate) enum Leaf {
    Null { pattern: u8 },
    Malloc(MallocMem),
    File(FileLeaf),
}

impl Leaf {
    fn kind(&self) -> &'static str {
        match self {
            Leaf::Null { .. } => "null",
            Leaf::Malloc(_) => "malloc",
            Leaf::File(_) => "file",
        }
    }
}

#[derive(Clone)]
pub struct Bdev {
    name: String,
    size: u64,
    block_size: u32,
    offset: u64,
    leaf: Arc<Leaf>,
    delays: Vec<DelayModel>,
    /// The model device whose timing this bdev's IO follows, if any.
    model: Option<Arc<ModelDevice>>,
    /// Fault layers, innermost first.
    faults: Vec<Arc<Fault>>,
    caps: Caps,
}

impl std::fmt::Debug for Bdev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bdev")
            .field("name", &self.name)
            .field("kind", &self.kind())
            .field("size", &self.size)
            .field("offset", &self.offset)
            .field("delays", &self.delays.len())
            .field("model", &self.model.as_ref().map(|m| m.params))
            .field("faults", &self.faults.len())
            .finish()
    }
}

fn iovecs<'a>(io: &IoRequest) -> &'a [libc::iovec] {
    if io.iovcnt == 0 || io.iov.is_null() {
        return &[];
    }
    // SAFETY: the caller guarantees iov points at iovcnt valid iovecs that
    // outlive the IO (the `prepare` contract).
    unsafe { std::slice::from_raw_parts(io.iov, io.iovcnt as usize) }
}

impl Bdev {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn caps(&self) -> Caps {
        self.caps
    }
    /// Kind of the leaf device: "null", "malloc" or "file".
    pub fn kind(&self) -> &'static str {
        self.leaf.kind()
    }
    pub fn has_delay(&self) -> bool {
        !self.delays.is_empty() || self.model.is_some() || !self.faults.is_empty()
    }
    /// The model device's parameters, for a `model` bdev (and bdevs over one).
    pub fn model_params(&self) -> Option<ModelParams> {
        self.model.as_ref().map(|m| m.params)
    }

    /// Prepares one IO: performs it now (memory) or returns SQEs (file).
    ///
    /// # Safety
    /// `io.iov` must point at `io.iovcnt` iovecs describing writable memory of
    /// `io.len` bytes in total, valid and unmoved until the IO completes. The
    /// caller has checked that the range lies inside the bdev.
    pub unsafe fn prepare(&self, io: &IoRequest) -> Prep {
        let abs = self.offset + io.offset;
        if let Some(errno) = self.faults.iter().find_map(|f| f.fail(io.op, abs, io.len)) {
            return Prep::Done(IoResult::Err(errno));
        }
        if let Some(model) = &self.model {
            model.admit_now(io.op, abs, io.len);
        }
        match &*self.leaf {
            Leaf::Null { pattern } => {
                if io.op == IoOp::Read {
                    for v in iovecs(io) {
                        // SAFETY: the caller's iovecs are writable for iov_len bytes.
                        unsafe {
                            std::ptr::write_bytes(v.iov_base.cast::<u8>(), *pattern, v.iov_len)
                        };
                    }
                }
                Prep::Done(IoResult::Ok)
            }
            Leaf::Malloc(m) => Prep::Done(m.execute(io.op, abs, io.len, iovecs(io))),
            Leaf::File(f) => f.prepare(io.op, abs, io.len, iovecs(io)),
        }
    }

    /// A READ's data where it already lies, to send from there instead of
    /// running `prepare` (a malloc bdev's written RAM; nothing with a model
    /// or delays, whose timing `prepare` carries). The memory lives as long
    /// as the bdev; a write to it meanwhile races the send, as overlapping
    /// IO in flight may on any disk.
    pub fn lend_read(&self, io: &IoRequest) -> Option<libc::iovec> {
        if io.op != IoOp::Read || self.has_delay() {
            return None;
        }
        match &*self.leaf {
            Leaf::Malloc(m) => m.lend(self.offset + io.offset, io.len),
            _ => None,
        }
    }

    /// The memory `lend_read` lends from (address, length), which stays
    /// mapped as long as the bdev: a driver may let the kernel reference
    /// its pages past a send's completion (splicing them into a socket).
    pub fn lent_memory(&self) -> Option<(usize, usize)> {
        match &*self.leaf {
            Leaf::Malloc(m) => Some(m.mapping()),
            _ => None,
        }
    }

    /// Result of an IO from the CQE result of its last SQE.
    pub fn complete(&self, io: &IoRequest, cqe_result: i32) -> IoResult {
        match &*self.leaf {
            Leaf::File(f) => f.complete(io.op, io.len, iovecs(io), cqe_result),
            _ => IoResult::Ok,
        }
    }

    /// Time to hold this IO's completion, from every delay layer and the
    /// model device. Call it right after `prepare` on the same thread.
    pub fn sample_delay_ns(&self, op: IoOp, rng: &mut impl rand::Rng) -> u64 {
        let model = if self.model.is_some() {
            model::take_pending_hold_ns()
        } else {
            0
        };
        model
            + self
                .delays
                .iter()
                .map(|d| d.sample_ns(op, rng))
                .sum::<u64>()
            + self.faults.iter().map(|f| f.latency_ns(op)).sum::<u64>()
    }

    /// When to let IO `op`, submitted at `t_submit` and completed by the
    /// device at `now`, complete: after its delays and any stall of a
    /// fault layer (a stall held until released answers when to look again,
    /// with [`Bdev::still_stalled`]). Call it right after `prepare`.
    pub fn release_at(&self, op: IoOp, t_submit: u64, now: u64, rng: &mut impl rand::Rng) -> u64 {
        let delayed = t_submit + self.sample_delay_ns(op, rng);
        self.faults
            .iter()
            .filter_map(|f| f.stall_end(op, now))
            .fold(delayed, u64::max)
    }

    /// For an IO held at `now`: when to let it go or look again, if a
    /// stall of a fault layer still holds it.
    pub fn still_stalled(&self, now: u64) -> Option<u64> {
        self.faults
            .iter()
            .filter_map(|f| f.still_stalled(now))
            .max()
    }

    /// base:allocation extents `(length, flags)` from `offset`, covering at
    /// most `len` bytes (possibly fewer).
    pub fn block_status(&self, offset: u64, len: u32) -> Vec<(u32, u32)> {
        match &*self.leaf {
            Leaf::File(f) => f.block_status(self.offset + offset, len),
            Leaf::Malloc(m) => m.block_status(self.offset + offset, len),
            _ => vec![(len, 0)],
        }
    }
}

/// A base:allocation extent that is a hole reading as zeros
/// (NBD_STATE_HOLE | NBD_STATE_ZERO).
pub const EXTENT_HOLE: u32 = 1 | 2;

/// Appends an extent of `len` bytes, merged into the last one when their
/// flags match.
fn push_extent(out: &mut Vec<(u32, u32)>, len: u32, flags: u32) {
    match out.last_mut() {
        Some(last) if last.1 == flags => last.0 += len,
        _ => out.push((len, flags)),
    }
}

/// Every bdev the config built, by name.
#[derive(Debug)]
pub struct BdevSet {
    bdevs: HashMap<String, Arc<Bdev>>,
    order: Vec<String>,
}

impl BdevSet {
    pub fn get(&self, name: &str) -> Option<Arc<Bdev>> {
        self.bdevs.get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// The fault layer of fault bdev `name`.
    pub fn fault(&self, name: &str) -> Option<Arc<Fault>> {
        let b = self.bdevs.get(name)?;
        b.faults.iter().find(|f| f.name() == name).cloned()
    }

    /// Every fault bdev's layer, in config order.
    pub fn faults(&self) -> Vec<Arc<Fault>> {
        self.order.iter().filter_map(|n| self.fault(n)).collect()
    }

    /// fdatasync every file leaf (shutdown).
    pub fn flush_all_sync(&self) -> std::io::Result<()> {
        let mut seen = Vec::new();
        for b in self.bdevs.values() {
            if let Leaf::File(f) = &*b.leaf {
                let p = Arc::as_ptr(&b.leaf);
                if !seen.contains(&p) {
                    seen.push(p);
                    f.sync()?;
                }
            }
        }
        Ok(())
    }
}

fn err(index: usize, field: &'static str, message: impl Into<String>) -> BuildError {
    BuildError {
        index,
        field,
        message: message.into(),
    }
}

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
    for (i, s) in specs.iter().enumerate() {
        check_fields(s, i)?;
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
        let Some(base) = s.base.as_deref() else {
            return Err(err(
                i,
                "base",
                format!("a {:?} bdev needs a base", s.kind).to_lowercase(),
            ));
        };
        // A split part "namepN" is found through its split's spec.
        let found = self.by_name.get(base).copied().or_else(|| {
            self.specs.iter().position(|o| {
                o.kind == BdevKindName::Split
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
    fn malloc_budget(&mut self, i: usize) -> Result<Arc<Budget>, BuildError> {
        let ram = &mut self.ram;
        // RAM unknown (sysconf failed): the shared budget is unbounded, not
        // zero, which would refuse every write.
        let half = match ram.machine {
            0 => u64::MAX,
            m => m / 2,
        };
        let budget = match self.specs[i].max_resident {
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
            let field = match self.specs[i].max_resident {
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
    fn make_model(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let params = ModelParams::from_spec(&self.specs[i]).map_err(|(f, m)| err(i, f, m))?;
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
        let s = &self.specs[i];
        let block_size = block_size_of(s, i)?;
        let one = |leaf: Leaf, size: u64, caps: Caps| {
            Ok(vec![leaf_bdev(s, block_size, leaf, size, caps)])
        };
        match s.kind {
            BdevKindName::Null => {
                let size = sized(s, i)?;
                let pattern = s.pattern.unwrap_or(0xA5);
                one(Leaf::Null { pattern }, size, MEM_CAPS)
            }
            // Checked as served: mapping costs address space, not RAM.
            BdevKindName::Malloc => {
                let size = sized(s, i)?;
                let budget = self.malloc_budget(i)?;
                let mem = MallocMem::new(size, budget).map_err(|e| {
                    let msg = format!(
                        "cannot map {} of address space: {e} (a malloc bdev maps its \
                         whole size; 64 TiB is about the most a 47-bit address space takes)",
                        ByteSize(size)
                    );
                    err(i, "size", msg)
                })?;
                one(Leaf::Malloc(mem), size, MEM_CAPS)
            }
            BdevKindName::File => {
                let (leaf, size, caps) = self.file_leaf(i)?;
                one(leaf, size, caps)
            }
            BdevKindName::Split => self.make_split(i),
            BdevKindName::Delay => self.make_delay(i),
            BdevKindName::Model => self.make_model(i),
            BdevKindName::Fault => self.make_fault(i),
        }
    }

    /// A file bdev's leaf (a null stand-in when only checking), size and caps.
    fn file_leaf(&self, i: usize) -> Result<(Leaf, u64, Caps), BuildError> {
        let s = &self.specs[i];
        let Some(path) = &s.path else {
            return Err(err(i, "path", "a file bdev needs a path"));
        };
        let size = s.size.map(|b| b.0);
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
            BuildMode::Check => file::planned_size(path, size)
                .map(|size| (Leaf::Null { pattern: 0 }, size, MEM_CAPS)),
            BuildMode::Serve => FileLeaf::open(path, size, s.direct.unwrap_or_default()).map(|f| {
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

    fn make_split(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let parts = match self.specs[i].parts {
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

    fn make_delay(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let base = self.base_of(i)?;
        let s = &self.specs[i];
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
            name: s.name.clone(),
            delays,
            ..(*base).clone()
        })])
    }
}

impl Builder<'_> {
    fn make_fault(&mut self, i: usize) -> Result<Vec<Arc<Bdev>>, BuildError> {
        let base = self.base_of(i)?;
        let s = &self.specs[i];
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
        faults.push(Arc::new(Fault::new(&s.name, base.offset, params)));
        Ok(vec![Arc::new(Bdev {
            name: s.name.clone(),
            faults,
            ..(*base).clone()
        })])
    }
}

/// A field set that the bdev's kind does not use is an error, not ignored:
/// `size` on a split or `max_resident` on a null says the config means
/// something it does not get.
fn check_fields(s: &BdevSpec, i: usize) -> Result<(), BuildError> {
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
};

fn block_size_of(s: &BdevSpec, i: usize) -> Result<u32, BuildError> {
    match s.block_size {
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
fn sized(s: &BdevSpec, i: usize) -> Result<u64, BuildError> {
    match s.size {
        Some(ByteSize(0)) => Err(err(i, "size", "must be at least 1 byte")),
        Some(ByteSize(n)) => within_max_size(n, i),
        None => Err(err(
            i,
            "size",
            format!("a {} bdev needs a size", kind_name(s.kind)),
        )),
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

fn kind_name(k: BdevKindName) -> &'static str {
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

#[cfg(test)]
mod tests;
