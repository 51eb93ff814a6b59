//! Runs an NVMe/TCP queue's device operations on a bdev, to completion:
//! memory bdevs at once, file bdevs through a small io_uring of the NVMe/TCP
//! thread (waited for). An emulated delay is returned, not slept: the
//! driver holds the completion on a timer.

use std::io;

use bdev::{Bdev, IoOp, IoRequest, IoResult, Prep};
use io_uring::IoUring;
use proto::nvme::queue::DevOp;
use proto::nvme::Status;

/// Largest piece one device call takes (the bdev's lengths are 32 bits).
const MAX_PIECE: u64 = (4 << 30) - 4096;

pub(crate) struct DeviceRunner {
    ring: IoUring,
    rng: rand::rngs::SmallRng,
}

/// A finished operation: READ data or a status, and the emulated delay.
pub(crate) struct Done {
    pub result: Result<Vec<u8>, Status>,
    pub delay_ns: u64,
}

impl DeviceRunner {
    pub(crate) fn new() -> io::Result<DeviceRunner> {
        use rand::SeedableRng;
        Ok(DeviceRunner {
            ring: IoUring::new(16)?,
            rng: rand::rngs::SmallRng::seed_from_u64(0x6e76_6d65),
        })
    }

    /// Runs `op` on `bdev` (offsets relative to it; the queue checked them).
    pub(crate) fn run(&mut self, bdev: &Bdev, op: DevOp) -> Done {
        let mut delay_ns = 0;
        let result = match op {
            DevOp::Read { offset, len } => {
                let mut buf = vec![0u8; len as usize];
                let r = self.one(bdev, IoOp::Read, offset, &mut buf, &mut delay_ns);
                r.map(|()| buf)
            }
            DevOp::Write {
                offset,
                mut data,
                fua,
            } => {
                let r = self.one(bdev, IoOp::Write { fua }, offset, &mut data, &mut delay_ns);
                r.map(|()| Vec::new())
            }
            DevOp::Flush => self
                .one(bdev, IoOp::Flush, 0, &mut [], &mut delay_ns)
                .map(|()| Vec::new()),
            DevOp::WriteZeroes { offset, len } => {
                let op = IoOp::WriteZeroes {
                    may_trim: false,
                    fua: false,
                    fast: false,
                };
                self.ranged(bdev, op, &[(offset, len)], &mut delay_ns)
            }
            DevOp::Trim { ranges } => {
                let op = IoOp::Trim { fua: false };
                self.ranged(bdev, op, &ranges, &mut delay_ns)
            }
        };
        Done { result, delay_ns }
    }

    /// A command without data over byte ranges, in pieces the bdev takes.
    fn ranged(
        &mut self,
        bdev: &Bdev,
        op: IoOp,
        ranges: &[(u64, u64)],
        delay: &mut u64,
    ) -> Result<Vec<u8>, Status> {
        for &(mut offset, mut len) in ranges {
            while len > 0 {
                let piece = len.min(MAX_PIECE);
                self.piece(bdev, op, offset, piece as u32, &mut [], delay)?;
                offset += piece;
                len -= piece;
            }
        }
        Ok(Vec::new())
    }

    fn one(
        &mut self,
        bdev: &Bdev,
        op: IoOp,
        offset: u64,
        buf: &mut [u8],
        delay: &mut u64,
    ) -> Result<(), Status> {
        let len = buf.len() as u32;
        self.piece(bdev, op, offset, len, buf, delay)
    }

    /// One bdev IO over `buf` (empty for commands without data).
    fn piece(
        &mut self,
        bdev: &Bdev,
        op: IoOp,
        offset: u64,
        len: u32,
        buf: &mut [u8],
        delay: &mut u64,
    ) -> Result<(), Status> {
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let io = IoRequest {
            op,
            offset,
            len,
            iov: &iov,
            iovcnt: u32::from(!buf.is_empty()),
        };
        // SAFETY: `iov` describes `buf`, which outlives the IO: it completes
        // before this function returns (memory at once, files waited for).
        let prep = unsafe { bdev.prepare(&io) };
        *delay += bdev.sample_delay_ns(op, &mut self.rng);
        let r = match prep {
            Prep::Done(r) => r,
            Prep::Sqes(sqes) => self.wait(bdev, &io, sqes),
        };
        match r {
            IoResult::Ok => Ok(()),
            IoResult::Err(e) => Err(status_of(e)),
        }
    }

    /// Submits a file IO's SQEs (linked) and waits for all of them.
    fn wait(
        &mut self,
        bdev: &Bdev,
        io: &IoRequest,
        sqes: Vec<io_uring::squeue::Entry>,
    ) -> IoResult {
        let n = sqes.len();
        let mut last = 0;
        for (i, e) in sqes.into_iter().enumerate() {
            let e = if i + 1 < n {
                e.flags(io_uring::squeue::Flags::IO_LINK)
            } else {
                e
            };
            // SAFETY: the SQE's buffers (the caller's iovec) outlive the wait.
            if unsafe { self.ring.submission().push(&e.user_data(i as u64)) }.is_err() {
                return IoResult::Err(libc::EIO as u32);
            }
        }
        let (mut seen, mut first_err) = (0, None);
        while seen < n {
            if self.ring.submit_and_wait(n - seen).is_err() {
                return IoResult::Err(libc::EIO as u32);
            }
            for c in self.ring.completion() {
                seen += 1;
                let r = c.result();
                if r < 0 && r != -libc::ECANCELED && first_err.is_none() {
                    first_err = Some(r);
                }
                if c.user_data() as usize == n - 1 {
                    last = r;
                }
            }
        }
        let last = first_err.unwrap_or(last);
        bdev.complete(io, last)
    }
}

/// An NVMe status for a device error (an errno).
fn status_of(errno: u32) -> Status {
    match errno as i32 {
        libc::EPERM | libc::EROFS => Status::NAMESPACE_WRITE_PROTECTED,
        libc::ENOSPC => Status::generic(0x81), // capacity exceeded
        libc::EINVAL => Status::INVALID_FIELD,
        _ => Status::INTERNAL_ERROR,
    }
}
