//! Block devices: null, malloc, file (io_uring), split, delay, fault and model.
//!
//! A stack (delay over split over file, ...) is resolved at build time into a
//! flat [`Bdev`]: one leaf, a byte offset and the delay layers. This crate
//! owns no ring: file IO is returned as io_uring SQEs for the reactor to
//! submit, memory IO completes synchronously, and delays are sampled here but
//! applied by the reactor's timers, so no thread ever sleeps for an IO.

use std::collections::HashMap;
use std::sync::Arc;

mod build;
mod delay;
pub mod dirty;
pub mod dirty_file;
mod fault;
mod file;
mod file_access;
mod file_size;
pub mod identity;
mod memory;
mod model;
mod size;
mod spec;

pub use build::{build, check, MAX_PARTS, MAX_SIZE};
pub use delay::DelayModel;
pub use fault::{Errno, FailRange, Fault, FaultOp, FaultParams, FaultStatus, STALL_RECHECK_NS};
pub use model::{ModelDevice, ModelParams, ModelState};
pub use size::ByteSize;
pub use spec::{
    specs, BdevKind, BdevKindName, BdevSpec, BdevTable, BuildError, DelaySpec, DirectMode,
    FaultSpec, Geometry, ModelSpec,
};

pub use file::thin_shortfall;
use file::FileLeaf;
use memory::MallocMem;

/// Backends fail with NBD error values, from the protocol's one table.
pub use proto::{EINVAL, EIO, ENOSPC, ENOTSUP};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    pub flush: bool,
    pub fua: bool,
    pub trim: bool,
    pub write_zeroes: bool,
    pub fast_zero: bool,
    pub rotational: bool,
    /// Its device cannot be written (a file bdev whose image only opens
    /// read-only): only read-only exports may serve it.
    pub read_only: bool,
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
    /// Whether trimmed blocks read as zeros afterwards: RAM does, a null
    /// device only with pattern 0, a file only when its trim punches holes
    /// (else a trim does nothing and the old data stays).
    pub fn trim_reads_zero(&self) -> bool {
        match &*self.leaf {
            Leaf::Null { pattern } => *pattern == 0,
            Leaf::Malloc(_) => true,
            Leaf::File(_) => self.caps.trim,
        }
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

#[cfg(test)]
mod tests;
