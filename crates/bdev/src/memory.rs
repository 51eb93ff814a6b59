//! RAM for malloc bdevs: one lazily allocated anonymous mapping, with an
//! allocation map in chunks so block status reports holes and trim or
//! write-zeroes of whole chunks gives the memory back: a 1 GiB export costs
//! what was written. The map is a lazily allocated mapping too, so a large
//! sparse export costs address space, not RAM, until it is written; and the
//! written chunks draw on a [`Budget`], so a client writing more than the
//! RAM it may take gets ENOSPC instead of the OOM killer taking the server.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{IoOp, IoResult, EXTENT_HOLE};

/// Allocation-map granularity: small enough for sparse images, large enough
/// that a 1 GiB map is 2 KiB of bits.
const CHUNK: usize = 64 << 10;

/// RAM that written chunks may take: one budget per malloc bdev with a
/// `max_resident`, one shared by the others. A chunk is charged whole when
/// first written and refunded when zeroed whole.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// Takes one chunk's bytes, if they fit.
    fn charge(&self) -> bool {
        let chunk = CHUNK as u64;
        let before = self.used.fetch_add(chunk, Ordering::AcqRel);
        if before.saturating_add(chunk) > self.limit {
            self.used.fetch_sub(chunk, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn refund(&self) {
        let before = self.used.fetch_sub(CHUNK as u64, Ordering::AcqRel);
        debug_assert!(before >= CHUNK as u64, "a chunk refunded twice");
    }

    /// Bytes charged now.
    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// Bytes of RAM this machine has (0 if unknown).
pub(crate) fn physical_ram() -> u64 {
    // SAFETY: sysconf only reads system values.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    u64::try_from(pages).unwrap_or(0) * u64::try_from(page).unwrap_or(0)
}

/// `len` bytes of anonymous memory, paid for only when written (reading
/// an untouched page maps the shared zero page).
fn map_anon(len: usize) -> io::Result<*mut u8> {
    // SAFETY: anonymous private mapping, checked below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base.cast())
}

pub(crate) struct MallocMem {
    base: *mut u8,
    len: usize,
    /// One bit per chunk, `words` words of them: set once any byte of it
    /// was written. Shared by the reactors, hence atomic; a chunk is marked
    /// before its data is copied, so block status never calls unwritten
    /// data a hole. An unmarked chunk's bytes are all zero.
    written: *const AtomicU64,
    words: usize,
    budget: Arc<Budget>,
}

// SAFETY: the mappings live as long as the struct; concurrent IO to
// overlapping ranges is the client's business, as on a real disk.
unsafe impl Send for MallocMem {}
// SAFETY: see above.
unsafe impl Sync for MallocMem {}

impl Drop for MallocMem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mappings.
        unsafe {
            libc::munmap(self.base.cast(), self.len.max(1));
            libc::munmap(self.written as *mut libc::c_void, (self.words * 8).max(1));
        }
    }
}

const PAGE: usize = 4096;

impl MallocMem {
    /// A RAM disk of `size` bytes whose written chunks draw on `budget`.
    pub fn new(size: u64, budget: Arc<Budget>) -> io::Result<MallocMem> {
        let len = usize::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let base = map_anon(len)?;
        let words = len.div_ceil(CHUNK).div_ceil(64);
        let written = match map_anon(words * 8) {
            Ok(w) => w.cast::<AtomicU64>(),
            Err(e) => {
                // SAFETY: unmapping the mapping made above.
                unsafe { libc::munmap(base.cast(), len.max(1)) };
                return Err(e);
            }
        };
        Ok(MallocMem {
            base,
            len,
            written,
            words,
            budget,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `words` zero-initialised (all bits clear is a valid
        // AtomicU64) and page-aligned words, mapped as long as `self`.
        unsafe { std::slice::from_raw_parts(self.written, self.words) }
    }

    fn is_written(&self, chunk: usize) -> bool {
        self.words()[chunk / 64].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
    }

    /// Marks the chunks of `offset..offset + len` written, charging the
    /// budget for each one newly marked: false (ENOSPC) when it has no room
    /// left. Chunks marked before that stay marked; they read as the zeros
    /// they hold.
    fn allocate(&self, offset: usize, len: usize) -> bool {
        debug_assert!(len > 0 && offset + len <= self.len);
        for chunk in offset / CHUNK..=(offset + len - 1) / CHUNK {
            if self.is_written(chunk) {
                continue;
            }
            if !self.budget.charge() {
                return false;
            }
            let bit = 1u64 << (chunk % 64);
            if self.words()[chunk / 64].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
                // Another reactor's write marked it meanwhile.
                self.budget.refund();
            }
        }
        true
    }

    /// Unmarks whole chunks `first..end`, refunding each that was marked.
    fn release(&self, first: usize, end: usize) {
        for chunk in first..end {
            let bit = 1u64 << (chunk % 64);
            if self.words()[chunk / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
                self.budget.refund();
            }
        }
    }

    /// base:allocation extents from `offset`, at most `len` bytes: written
    /// chunks are data, the rest holes that read as zeros.
    pub fn block_status(&self, offset: u64, len: u32) -> Vec<(u32, u32)> {
        let Ok(start) = usize::try_from(offset) else {
            return vec![(len, 0)];
        };
        let end = start.saturating_add(len as usize).min(self.len);
        let mut out: Vec<(u32, u32)> = Vec::new();
        let mut pos = start;
        // Like the file bdev, a bounded reply: the client asks again from
        // where it ends.
        while pos < end && out.len() < 256 {
            let chunk = pos / CHUNK;
            let next = ((chunk + 1) * CHUNK).min(end);
            let flags = if self.is_written(chunk) {
                0
            } else {
                EXTENT_HOLE
            };
            crate::push_extent(&mut out, (next - pos) as u32, flags);
            pos = next;
        }
        out
    }

    /// Zeroes `offset..offset + len`; with `holes`, whole chunks become
    /// holes again and their budget is refunded.
    fn zero(&self, offset: usize, len: usize, holes: bool) {
        if holes {
            let first_chunk = offset.div_ceil(CHUNK);
            let end_chunk = (offset + len) / CHUNK;
            self.release(first_chunk, end_chunk);
        }
        // Whole pages go back to the kernel and read as zeros again.
        let first = offset.div_ceil(PAGE) * PAGE;
        let last = (offset + len) / PAGE * PAGE;
        // SAFETY: all ranges below lie within the mapping (checked by the caller).
        unsafe {
            if last > first && last - first >= 16 * PAGE {
                std::ptr::write_bytes(self.base.add(offset), 0, first - offset);
                libc::madvise(
                    self.base.add(first).cast(),
                    last - first,
                    libc::MADV_DONTNEED,
                );
                std::ptr::write_bytes(self.base.add(last), 0, offset + len - last);
            } else {
                std::ptr::write_bytes(self.base.add(offset), 0, len);
            }
        }
    }

    /// Copies `n` bytes at `at` into `dst`; a hole's bytes are written as
    /// zeros without touching its pages, so reading unwritten RAM costs no
    /// page faults (nor the page tables they would build).
    ///
    /// # Safety
    /// `at + n` lies inside the mapping and `dst` is valid for `n` bytes.
    unsafe fn read_into(&self, mut at: usize, mut dst: *mut u8, n: usize) {
        let end = at + n;
        while at < end {
            let chunk = at / CHUNK;
            let span = ((chunk + 1) * CHUNK).min(end) - at;
            // SAFETY: the caller's bounds; `span` stays inside them.
            unsafe {
                if self.is_written(chunk) {
                    std::ptr::copy_nonoverlapping(self.base.add(at), dst, span);
                } else {
                    std::ptr::write_bytes(dst, 0, span);
                }
                dst = dst.add(span);
            }
            at += span;
        }
    }

    /// The mapped bytes `offset..offset + len`, if every chunk they touch
    /// was written: a reply may send them from here instead of copying them
    /// into a buffer first. Holes are not lent: sending them would fault in
    /// zero pages, and a copy writes their zeros for free.
    pub fn lend(&self, offset: u64, len: u32) -> Option<libc::iovec> {
        let at = usize::try_from(offset).ok()?;
        let end = at.checked_add(len as usize).filter(|&e| e <= self.len)?;
        if len == 0 || !(at / CHUNK..end.div_ceil(CHUNK)).all(|c| self.is_written(c)) {
            return None;
        }
        Some(libc::iovec {
            // SAFETY: at < end <= len keeps the pointer inside the mapping.
            iov_base: unsafe { self.base.add(at) }.cast(),
            iov_len: len as usize,
        })
    }

    /// Where the whole mapping lies (address, length): what [`lend`]
    /// hands out lies inside, and stays mapped as long as `self`.
    ///
    /// [`lend`]: MallocMem::lend
    pub fn mapping(&self) -> (usize, usize) {
        (self.base as usize, self.len)
    }

    pub fn execute(&self, op: IoOp, offset: u64, len: u32, iov: &[libc::iovec]) -> IoResult {
        let Ok(mut at) = usize::try_from(offset) else {
            return IoResult::Err(crate::EINVAL);
        };
        if at
            .checked_add(len as usize)
            .is_none_or(|end| end > self.len)
        {
            return IoResult::Err(crate::EINVAL);
        }
        if matches!(op, IoOp::Write { .. }) && len > 0 && !self.allocate(at, len as usize) {
            return IoResult::Err(crate::ENOSPC);
        }
        match op {
            IoOp::Read | IoOp::Write { .. } => {
                for v in iov {
                    let n = v.iov_len.min(self.len - at);
                    let buf = v.iov_base.cast::<u8>();
                    if op == IoOp::Read {
                        // SAFETY: as below.
                        unsafe { self.read_into(at, buf, n) };
                    } else {
                        // SAFETY: at + n is inside the mapping; the iovec is the caller's valid buffer.
                        unsafe { std::ptr::copy_nonoverlapping(buf, self.base.add(at), n) };
                    }
                    at += n;
                }
            }
            IoOp::Trim { .. } | IoOp::WriteZeroes { may_trim: true, .. } => {
                self.zero(at, len as usize, true)
            }
            // NO_HOLE: the range must stay provisioned, so later writes to it
            // cannot fail for want of space. Its chunks are charged and
            // marked written (data in block status); their pages may still
            // go back to the kernel, which maps them again on the next write
            // against the budget already taken.
            IoOp::WriteZeroes {
                may_trim: false, ..
            } => {
                if len > 0 && !self.allocate(at, len as usize) {
                    return IoResult::Err(crate::ENOSPC);
                }
                self.zero(at, len as usize, false)
            }
            IoOp::Flush | IoOp::Cache => {}
        }
        IoResult::Ok
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
