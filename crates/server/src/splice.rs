//! Sending replies through a pipe: a lent READ's data (a RAM export's own
//! pages) goes into the pipe by reference (`vmsplice`) and from the pipe
//! into the socket by reference (`splice`; Linux 6.5+ hands pipe pages to
//! Unix and TCP sockets without copying), so the sender never copies it.
//! Everything else a reply holds (its header, data in pool buffers) is
//! copied into the pipe (`write`): the engine reuses that memory as soon
//! as a send completes, while the socket would still reference its pages.
//!
//! Only memory the bdev keeps mapped for its whole life is passed by
//! reference, and the pages a pipe or socket holds stay alive by their own
//! references even if the bdev drops them (zeroing with `MADV_DONTNEED`,
//! unmapping): the client then reads the bytes as they were when spliced,
//! or as a later overlapping write left them, which a read that overlaps
//! a write in flight may show anyway. See
//! `docs/evidence.md#zero-copy`.
//!
//! The reactor owns one [`Pipe`] per connection that splices, and drives
//! each send: [`Pipe::fill`], then [`Pipe::drain_to`] until the pipe is
//! empty (a full socket: wait for `POLLOUT` and drain again).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Lent data below this many bytes per iovec is copied into the pipe
/// like the rest: mapping pages costs more than copying a few.
pub const MIN_SPLICE_SEG: usize = 32 << 10;

/// The pipe size asked for; the kernel caps it at
/// `/proc/sys/fs/pipe-max-size` (1 MiB by default).
const PIPE_SIZE: i32 = 1 << 20;

/// iovecs one `vmsplice` or `writev` takes at most (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// How one run of a send's iovecs goes into the pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// By reference (`vmsplice`): lent memory.
    Ref,
    /// Copied (`writev`).
    Copy,
}

/// Splits `iovs` into runs of consecutive iovecs that go into the pipe the
/// same way (at most `IOV_MAX` each), in order: lent ones (per `lent`) of
/// at least [`MIN_SPLICE_SEG`] bytes by reference, the rest copied.
pub fn plan(
    iovs: &[libc::iovec],
    lent: impl Fn(&libc::iovec) -> bool,
) -> Vec<(Fill, usize, usize)> {
    let mut runs: Vec<(Fill, usize, usize)> = Vec::new();
    for (i, v) in iovs.iter().enumerate() {
        let kind = if v.iov_len >= MIN_SPLICE_SEG && lent(v) {
            Fill::Ref
        } else {
            Fill::Copy
        };
        match runs.last_mut() {
            Some((k, start, end)) if *k == kind && *end - *start < IOV_MAX => *end = i + 1,
            _ => runs.push((kind, i, i + 1)),
        }
    }
    runs
}

/// Bytes of `iovs` that [`plan`] passes by reference.
pub fn ref_bytes(iovs: &[libc::iovec], lent: impl Fn(&libc::iovec) -> bool) -> usize {
    iovs.iter()
        .filter(|v| v.iov_len >= MIN_SPLICE_SEG && lent(v))
        .map(|v| v.iov_len)
        .sum()
}

/// A connection's pipe, both ends non-blocking.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes in the pipe not yet spliced into the socket.
    pub queued: usize,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for the two descriptors pipe2 returns.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors nobody else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A smaller pipe (pipe-max-size lowered) still works, in more rounds.
        // SAFETY: plain fcntl on our own pipe.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
        Ok(Pipe {
            read,
            write,
            queued: 0,
        })
    }

    /// Puts as much of `iovs` into the (empty) pipe as fits, lent memory
    /// (per `lent`) by reference and the rest copied, in order; returns the
    /// bytes put in, which may end inside an iovec. Zero with an error: the
    /// first write failed.
    ///
    /// # Safety
    /// Every iovec is readable for its length; those `lent` accepts stay
    /// mapped, and may be referenced by the kernel, for as long as the
    /// process lives (see the module's note).
    pub unsafe fn fill(
        &mut self,
        iovs: &[libc::iovec],
        lent: impl Fn(&libc::iovec) -> bool,
    ) -> io::Result<usize> {
        debug_assert_eq!(self.queued, 0, "a send began with bytes still in the pipe");
        let fd = self.write.as_raw_fd();
        let mut put = 0;
        for (kind, start, end) in plan(iovs, lent) {
            let run = &iovs[start..end];
            let want: usize = run.iter().map(|v| v.iov_len).sum();
            // SAFETY: the caller's iovecs; vmsplice without SPLICE_F_GIFT
            // takes references to the pages, writev copies.
            let r = unsafe {
                match kind {
                    Fill::Ref => {
                        libc::vmsplice(fd, run.as_ptr(), run.len(), libc::SPLICE_F_NONBLOCK)
                    }
                    Fill::Copy => libc::writev(fd, run.as_ptr(), run.len() as i32),
                }
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if put == 0 && e.raw_os_error() != Some(libc::EAGAIN) {
                    return Err(e);
                }
                break; // full (or a later run failed): send what is in
            }
            put += r as usize;
            if (r as usize) < want {
                break; // the pipe is full
            }
        }
        self.queued = put;
        Ok(put)
    }

    /// Splices what the pipe holds into `sock` (non-blocking) until the pipe
    /// is empty (true) or the socket is full (false).
    pub fn drain_to(&mut self, sock: i32) -> io::Result<bool> {
        while self.queued > 0 {
            // SAFETY: plain splice between two descriptors we own.
            let r = unsafe {
                libc::splice(
                    self.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    sock,
                    std::ptr::null_mut(),
                    self.queued,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(false),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            if r == 0 {
                return Err(io::Error::from_raw_os_error(libc::EPIPE));
            }
            self.queued -= r as usize;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(p: &[u8]) -> libc::iovec {
        libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        }
    }

    #[test]
    fn plan_passes_large_lent_runs_by_reference_and_copies_the_rest() {
        let hdr = [1u8; 16];
        let big = vec![2u8; 128 << 10];
        let small = vec![3u8; 4 << 10];
        let pool = vec![4u8; 128 << 10];
        let lent_ptrs = [big.as_ptr(), small.as_ptr()];
        let lent = |v: &libc::iovec| lent_ptrs.contains(&(v.iov_base as *const u8));
        let iovs = [
            iov(&hdr),
            iov(&big),
            iov(&big),
            iov(&hdr),
            iov(&small),
            iov(&pool),
            iov(&hdr),
            iov(&big),
        ];
        assert_eq!(
            plan(&iovs, lent),
            vec![
                (Fill::Copy, 0, 1),
                (Fill::Ref, 1, 3),
                // A small lent iovec and a pool buffer are copied.
                (Fill::Copy, 3, 7),
                (Fill::Ref, 7, 8),
            ]
        );
        assert_eq!(ref_bytes(&iovs, lent), 3 * (128 << 10));
        assert_eq!(plan(&[], lent), vec![]);
    }

    #[test]
    fn plan_runs_stay_within_iov_max() {
        let hdr = [0u8; 16];
        let iovs = vec![iov(&hdr); IOV_MAX + 5];
        assert_eq!(
            plan(&iovs, |_| false),
            vec![(Fill::Copy, 0, IOV_MAX), (Fill::Copy, IOV_MAX, IOV_MAX + 5)]
        );
    }

    fn socketpair() -> (OwnedFd, OwnedFd) {
        let mut sv = [0i32; 2];
        // SAFETY: sv has room for two descriptors.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
                0,
                sv.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: fresh descriptors.
        unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
    }

    fn read_all(fd: &OwnedFd, out: &mut Vec<u8>) {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            // SAFETY: reading into our own buffer.
            let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return;
            }
            out.extend_from_slice(&buf[..r as usize]);
        }
    }

    /// Pages that stay mapped for the test's whole run, like a bdev's.
    fn lent_region(len: usize, seed: u8) -> &'static mut [u8] {
        let v: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        v.leak()
    }

    #[test]
    fn a_send_through_the_pipe_arrives_in_order_across_full_pipes_and_sockets() {
        let (tx, rx) = socketpair();
        let mut pipe = Pipe::new().expect("pipe");
        let region = lent_region(4 << 20, 7);
        let base = region.as_ptr() as usize;
        let lent = |v: &libc::iovec| {
            let p = v.iov_base as usize;
            p >= base && p + v.iov_len <= base + (4 << 20)
        };
        // 24 replies of header + 128 KiB: more than a pipe and the socket
        // buffer hold, so fills and drains stop short and resume.
        let hdrs: Vec<[u8; 16]> = (0..24u8).map(|i| [i; 16]).collect();
        let mut iovs = Vec::new();
        let mut want = Vec::new();
        for (i, h) in hdrs.iter().enumerate() {
            let off = (i * 37 % 31) * (128 << 10);
            let data = &region[off..off + (128 << 10)];
            iovs.push(iov(h));
            iovs.push(iov(data));
            want.extend_from_slice(h);
            want.extend_from_slice(data);
        }
        let mut got = Vec::new();
        let mut sent = 0;
        let (mut fills, mut stalls) = (0, 0);
        while sent < want.len() {
            // The rest of the send, as the engine would post it again.
            let mut rest = Vec::new();
            let mut skip = sent;
            for v in &iovs {
                if skip >= v.iov_len {
                    skip -= v.iov_len;
                    continue;
                }
                rest.push(libc::iovec {
                    iov_base: (v.iov_base as usize + skip) as *mut libc::c_void,
                    iov_len: v.iov_len - skip,
                });
                skip = 0;
            }
            // SAFETY: the iovecs point at live memory; the region is leaked.
            let n = unsafe { pipe.fill(&rest, lent) }.expect("fill");
            assert!(n > 0);
            fills += 1;
            while !pipe.drain_to(tx.as_raw_fd()).expect("drain") {
                stalls += 1;
                read_all(&rx, &mut got);
            }
            sent += n;
        }
        read_all(&rx, &mut got);
        assert!(fills > 1, "the pipe filled up");
        assert!(stalls > 0, "the socket filled up");
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bytes arrived as sent");
    }

    #[test]
    fn a_closed_peer_fails_the_drain() {
        let (tx, rx) = socketpair();
        drop(rx);
        let mut pipe = Pipe::new().expect("pipe");
        let data = lent_region(64 << 10, 1);
        // SAFETY: leaked memory.
        let n = unsafe { pipe.fill(&[iov(data)], |_| true) }.expect("fill");
        assert_eq!(n, 64 << 10);
        let e = pipe.drain_to(tx.as_raw_fd()).expect_err("EPIPE");
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    }
}
