//! RAM for malloc bdevs: one lazily allocated anonymous mapping.

use std::io;

use crate::{IoOp, IoResult};

pub(crate) struct MallocMem {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping lives as long as the struct; concurrent IO to
// overlapping ranges is the client's business, as on a real disk.
unsafe impl Send for MallocMem {}
// SAFETY: see above.
unsafe impl Sync for MallocMem {}

impl Drop for MallocMem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

const PAGE: usize = 4096;

impl MallocMem {
    pub fn new(size: u64) -> io::Result<MallocMem> {
        let len = usize::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: anonymous private mapping, checked below. NORESERVE: pages
        // are only paid for when written.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MallocMem {
            base: base.cast(),
            len,
        })
    }

    fn zero(&self, offset: usize, len: usize) {
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
        match op {
            IoOp::Read | IoOp::Write { .. } => {
                for v in iov {
                    let n = v.iov_len.min(self.len - at);
                    // SAFETY: at + n is inside the mapping; the iovec is the caller's valid buffer.
                    unsafe {
                        let mem = self.base.add(at);
                        if op == IoOp::Read {
                            std::ptr::copy_nonoverlapping(mem, v.iov_base.cast::<u8>(), n);
                        } else {
                            std::ptr::copy_nonoverlapping(v.iov_base.cast::<u8>(), mem, n);
                        }
                    }
                    at += n;
                }
            }
            IoOp::Trim { .. } | IoOp::WriteZeroes { .. } => self.zero(at, len as usize),
            IoOp::Flush | IoOp::Cache => {}
        }
        IoResult::Ok
    }
}
