//! RAM for malloc bdevs: one lazily allocated anonymous mapping, with an
//! allocation map in chunks so block status reports holes and trim or
//! write-zeroes of whole chunks gives the memory back: a 1 GiB export costs
//! what was written. The map is a lazily allocated mapping too, so a large
//! sparse export costs address space, not RAM, until it is written; and the
//! written data draws on a [`Budget`], so a client writing more than the
//! RAM it may take gets ENOSPC instead of the OOM killer taking the server.
//!
//! The mapping uses transparent huge pages where the kernel offers them: a
//! 4 KiB READ's copy out of a cold RAM disk is most of a reactor's time, and
//! 2 MiB pages cut its TLB misses (+6-8% 4 KiB randread over NVMe/TCP,
//! BENCHMARKS.md). A huge page is resident as soon as one byte of it is
//! written, so such a mapping is charged per 2 MiB region, not per chunk.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{IoOp, IoResult, EXTENT_HOLE};

/// Allocation-map granularity: small enough for sparse images, large enough
/// that a 1 GiB map is 2 KiB of bits.
const CHUNK: usize = 64 << 10;

/// A transparent huge page (x86-64, and arm64 with 4 KiB pages): what the
/// kernel may back one written byte with on a mapping advised for them.
const REGION: usize = 2 << 20;

/// Budgets below this keep 64 KiB charging and 4 KiB pages: there, a
/// sparse writer would run out of room 32 times sooner with 2 MiB
/// regions, which matters more than the TLB (a 1 MiB budget on a 64 GiB
/// disk, as in tests/hostile.rs, would hold no region at all).
const HUGE_MIN_BUDGET: u64 = 64 * REGION as u64;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// RAM that written data may take: one budget per malloc bdev with a
/// `max_resident`, one shared by the others. Each bdev charges its regions
/// (a 2 MiB huge page, or a 64 KiB chunk) whole when first written and
/// refunds them when they hold no data again.
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

    /// Takes `bytes`, if they fit.
    fn charge(&self, bytes: u64) -> bool {
        let before = self.used.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.limit {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn refund(&self, bytes: u64) {
        let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "a region refunded twice");
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

/// Whether the kernel backs advised anonymous memory with 2 MiB pages:
/// THP `always` or `madvise`, at a 2 MiB PMD. With `never` (or no THP),
/// mappings keep 64 KiB charging rather than overcount sparse data 32
/// times; they are advised MADV_NOHUGEPAGE, so turning THP on later
/// cannot make their charges untrue.
fn thp_available() -> bool {
    let read = |f: &str| std::fs::read_to_string(format!("{THP}/{f}")).unwrap_or_default();
    let enabled = read("enabled");
    (enabled.contains("[always]") || enabled.contains("[madvise]"))
        && read("hpage_pmd_size").trim() == REGION.to_string()
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

/// The RAM disk's mapping. With `huge`, it starts on a 2 MiB boundary, so
/// each region is one huge page (a tail shorter than 2 MiB cannot be one:
/// the mapping ends inside it), and is advised MADV_HUGEPAGE.
fn map_data(len: usize, huge: bool) -> io::Result<*mut u8> {
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    let (base, len) = if huge {
        let span = len
            .checked_add(REGION)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let raw = map_anon(span)?;
        let head = raw.align_offset(REGION);
        let keep = len.max(1).next_multiple_of(PAGE);
        let tail = span.next_multiple_of(PAGE) - head - keep;
        // SAFETY: both slack ranges lie in the mapping made above, outside
        // the aligned part kept.
        unsafe {
            if head > 0 {
                libc::munmap(raw.cast(), head);
            }
            if tail > 0 {
                libc::munmap(raw.add(head + keep).cast(), tail);
            }
        }
        // SAFETY: head < REGION, inside the mapping.
        (unsafe { raw.add(head) }, keep)
    } else {
        (map_anon(len)?, len.max(1))
    };
    // Failure means a kernel without THP: then a 2 MiB charge only
    // overcounts, and 4 KiB pages are all there is.
    // SAFETY: advising our own mapping.
    unsafe { libc::madvise(base.cast(), len, advice) };
    Ok(base)
}

pub(crate) struct MallocMem {
    base: *mut u8,
    len: usize,
    /// One bit per chunk, `words` words of them: set once any byte of it
    /// was written. Shared by the reactors, hence atomic; a chunk is marked
    /// before its data is copied, so block status never calls unwritten
    /// data a hole. An unmarked chunk's bytes are all zero, and its pages
    /// are never touched.
    written: *const AtomicU64,
    words: usize,
    /// What the budget is charged in: `REGION` with huge pages, else
    /// `CHUNK`. A region is charged while any of its chunks is marked.
    region: usize,
    /// Held to charge a region or to clear marks: so a region emptied by a
    /// trim is given back whole before a write may charge it again (else
    /// the MADV_DONTNEED could drop the new write's data).
    charging: Mutex<()>,
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
    /// A RAM disk of `size` bytes whose written data draws on `budget`,
    /// with huge pages if the kernel offers them and the budget is large.
    pub fn new(size: u64, budget: Arc<Budget>) -> io::Result<MallocMem> {
        let huge = budget.limit >= HUGE_MIN_BUDGET && thp_available();
        MallocMem::with_pages(size, budget, huge)
    }

    /// As [`MallocMem::new`], huge pages (and 2 MiB charges) chosen.
    fn with_pages(size: u64, budget: Arc<Budget>, huge: bool) -> io::Result<MallocMem> {
        let len = usize::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let base = map_data(len, huge)?;
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
            region: if huge { REGION } else { CHUNK },
            charging: Mutex::new(()),
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

    fn lock(&self) -> MutexGuard<'_, ()> {
        // It guards no data: a panic while held leaves nothing torn.
        self.charging.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bits, in `chunk`'s word, of the chunks in its region (a region
    /// is 1 or 32 chunks, so its bits share one word).
    fn region_mask(&self, chunk: usize) -> u64 {
        let per = self.region / CHUNK;
        let ones = u64::MAX >> (64 - per);
        ones << (chunk % 64 / per * per)
    }

    /// What `chunk`'s region costs: all of it, but a tail region only its
    /// pages (the mapping ends inside it, so no huge page backs it).
    fn region_bytes(&self, chunk: usize) -> u64 {
        let start = chunk * CHUNK / self.region * self.region;
        let bytes = self.region.min(self.len - start).next_multiple_of(PAGE);
        bytes as u64
    }

    /// Gives back the pages of `from..to` (page-aligned start) to the kernel.
    fn dontneed(&self, from: usize, to: usize) {
        let to = to.min(self.len);
        if to > from {
            // SAFETY: inside the mapping; reads as zeros afterwards.
            unsafe { libc::madvise(self.base.add(from).cast(), to - from, libc::MADV_DONTNEED) };
        }
    }

    /// Marks the chunks of `offset..offset + len` written, charging the
    /// budget for each region newly holding data: false (ENOSPC) when it
    /// has no room left. Chunks marked before that stay marked; they read
    /// as the zeros they hold.
    fn allocate(&self, offset: usize, len: usize) -> bool {
        debug_assert!(len > 0 && offset + len <= self.len);
        (offset / CHUNK..=(offset + len - 1) / CHUNK).all(|c| self.is_written(c) || self.mark(c))
    }

    /// Marks `chunk`: without the lock while its region holds data (the
    /// compare-exchange sees a trim that empties it), under it when the
    /// region must be charged.
    fn mark(&self, chunk: usize) -> bool {
        let word = &self.words()[chunk / 64];
        let (bit, mask) = (1u64 << (chunk % 64), self.region_mask(chunk));
        let mut w = word.load(Ordering::Acquire);
        while w & mask != 0 {
            if w & bit != 0 {
                return true;
            }
            match word.compare_exchange_weak(w, w | bit, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
        let _held = self.lock();
        // Only the lock's holder empties a region, so one found holding
        // data here keeps it until the bit is set.
        if word.load(Ordering::Acquire) & mask == 0 && !self.budget.charge(self.region_bytes(chunk))
        {
            return false;
        }
        word.fetch_or(bit, Ordering::AcqRel);
        true
    }

    /// Unmarks whole chunks `first..end` and gives their pages back. A
    /// region left with no data is refunded and given back whole: a huge
    /// page backs its holes too, so freeing only the trimmed chunks would
    /// leave it resident, uncharged.
    fn release(&self, first: usize, end: usize) {
        let _held = self.lock();
        let per = self.region / CHUNK;
        let mut c = first;
        while c < end {
            let stop = ((c / per + 1) * per).min(end);
            let n = stop - c;
            let bits = (u64::MAX >> (64 - n)) << (c % 64);
            let mask = self.region_mask(c);
            let before = self.words()[c / 64].fetch_and(!bits, Ordering::AcqRel) & mask;
            if before != 0 && before & !bits == 0 {
                self.budget.refund(self.region_bytes(c));
                let start = c / per * per * CHUNK;
                self.dontneed(start, start + self.region);
            } else if before != 0 {
                self.dontneed(c * CHUNK, stop * CHUNK);
            }
            c = stop;
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
    /// holes again and their regions are refunded once empty.
    fn zero(&self, offset: usize, len: usize, holes: bool) {
        let end = offset + len;
        if !holes {
            // Every chunk in range was allocated (charged) first.
            return self.zero_pages(offset, end);
        }
        // A range to the disk's end covers its last chunk, however short.
        let last = if end == self.len {
            end.div_ceil(CHUNK)
        } else {
            end / CHUNK
        };
        let first = offset.div_ceil(CHUNK);
        if first >= last {
            return self.zero_written(offset, end);
        }
        self.release(first, last);
        self.zero_written(offset, first * CHUNK);
        self.zero_written(last * CHUNK, end);
    }

    /// Zeroes the written chunks' bytes in `from..to`: a hole's are zeros
    /// already, and writing them would fault in pages no budget pays for.
    fn zero_written(&self, from: usize, to: usize) {
        let mut at = from;
        while at < to {
            let next = ((at / CHUNK + 1) * CHUNK).min(to);
            if self.is_written(at / CHUNK) {
                self.zero_pages(at, next);
            }
            at = next;
        }
    }

    /// Zeroes `from..to`: whole pages go back to the kernel and read as
    /// zeros again, when there are enough of them to pay for the call.
    fn zero_pages(&self, from: usize, to: usize) {
        let first = from.div_ceil(PAGE) * PAGE;
        let last = to / PAGE * PAGE;
        // SAFETY: all ranges below lie within the mapping (checked by the caller).
        unsafe {
            if last > first && last - first >= 16 * PAGE {
                std::ptr::write_bytes(self.base.add(from), 0, first - from);
                self.dontneed(first, last);
                std::ptr::write_bytes(self.base.add(last), 0, to - last);
            } else {
                std::ptr::write_bytes(self.base.add(from), 0, to - from);
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
