//! Regular files and block devices through io_uring.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::OnceLock;

use io_uring::{opcode, squeue, types};

use crate::file_access::is_block_device;
use crate::file_access::{opened_read_only, write_refused};
use crate::file_size::{claimed, served_size};
pub use crate::file_size::{larger_than, planned_size, thin_shortfall};
use crate::{Caps, DirectMode, IoOp, IoResult, Prep, EIO, ENOSPC, ENOTSUP};

/// O_DIRECT is used only when offset, length and every buffer are aligned to this.
const DIRECT_ALIGN: u64 = 4096;

/// Zeros for WRITE_ZEROES where fallocate cannot zero: one static page
/// referenced by every iovec, so no buffer is needed.
const ZERO_CHUNK: usize = 64 << 10;
const ZERO_IOVS: usize = 256;

#[repr(align(4096))]
struct ZeroPage([u8; ZERO_CHUNK]);
static ZEROS: ZeroPage = ZeroPage([0; ZERO_CHUNK]);

struct ZeroIov([libc::iovec; ZERO_IOVS]);
// SAFETY: the iovecs point at the immutable static ZEROS.
unsafe impl Sync for ZeroIov {}
// SAFETY: as above.
unsafe impl Send for ZeroIov {}

fn zero_iov() -> &'static [libc::iovec; ZERO_IOVS] {
    static IOV: OnceLock<ZeroIov> = OnceLock::new();
    &IOV.get_or_init(|| {
        ZeroIov(
            [libc::iovec {
                iov_base: ZEROS.0.as_ptr() as *mut libc::c_void,
                iov_len: ZERO_CHUNK,
            }; ZERO_IOVS],
        )
    })
    .0
}

pub(crate) struct FileLeaf {
    buffered: File,
    direct: Option<File>,
    size: u64,
    block_device: bool,
    punch_hole: bool,
    zero_range: bool,
    rotational: bool,
    /// Opened read-only: the image cannot be written (see [`write_refused`]).
    read_only: bool,
}

fn fallocate(fd: i32, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on our own fd.
    let r = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether an O_DIRECT read of one aligned block works on this file.
fn direct_works(f: &File, size: u64) -> bool {
    if size < DIRECT_ALIGN {
        return false;
    }
    let layout = std::alloc::Layout::from_size_align(DIRECT_ALIGN as usize, DIRECT_ALIGN as usize);
    let Ok(layout) = layout else { return false };
    // SAFETY: allocation of a non-zero size, freed below.
    let buf = unsafe { std::alloc::alloc(layout) };
    if buf.is_null() {
        return false;
    }
    // SAFETY: buf is DIRECT_ALIGN bytes, aligned.
    let r = unsafe { libc::pread(f.as_raw_fd(), buf.cast(), DIRECT_ALIGN as usize, 0) };
    // SAFETY: freeing what we allocated with the same layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    r == DIRECT_ALIGN as isize
}

fn rotational(f: &File) -> bool {
    let Ok(meta) = f.metadata() else { return false };
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/queue/rotational"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// Takes an exclusive advisory lock on the image for as long as `f` is open,
/// as qemu does on its images: two servers (or two bdevs) on one image would
/// each overwrite what the other acknowledged. Filesystems without locks
/// are served unlocked.
fn lock_exclusive(f: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "in use: another process (or another bdev of this config) has it open",
        )),
        Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::EINVAL) => Ok(()),
        _ => Err(e),
    }
}

/// Which of hole punching and zeroing a regular file's filesystem does,
/// probed past its end (`size`), where they change no data.
fn probe_fallocate(fd: i32, size: u64) -> (bool, bool) {
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    let punch = fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | keep, size, DIRECT_ALIGN).is_ok();
    let zero = fallocate(fd, libc::FALLOC_FL_ZERO_RANGE | keep, size, DIRECT_ALIGN).is_ok();
    if zero && punch {
        let _ = fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | keep, size, DIRECT_ALIGN);
    }
    (punch, zero)
}

impl FileLeaf {
    /// Opens (with a `size`, creates or extends) the image at `path`. A
    /// file this call created is removed again if it cannot be served, so
    /// a failed start leaves nothing behind.
    /// An image that refuses writing is opened read-only (only read-only
    /// exports may then serve it).
    pub fn open(path: &str, size: Option<u64>, mode: DirectMode) -> io::Result<FileLeaf> {
        let exists = std::path::Path::new(path).exists();
        let mut options = OpenOptions::new();
        options
            .read(true)
            .write(true)
            .create(size.is_some() && !exists)
            .truncate(false);
        if is_block_device(path) {
            options.custom_flags(libc::O_EXCL);
        }
        let buffered = match options.open(path) {
            Err(e) if exists && write_refused(&e) => options.write(false).open(path),
            r => r,
        };
        let buffered = buffered.map_err(claimed)?;
        let opened = Self::open_from(buffered, path, size, mode);
        if opened.is_err() && !exists {
            let _ = std::fs::remove_file(path);
        }
        opened
    }

    fn open_from(
        buffered: File,
        path: &str,
        size: Option<u64>,
        mode: DirectMode,
    ) -> io::Result<FileLeaf> {
        let ft = buffered.metadata()?.file_type();
        let block_device = ft.is_block_device();
        if !block_device && !ft.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        lock_exclusive(&buffered)?;
        let read_only = opened_read_only(&buffered, block_device);
        let size = served_size(&buffered, block_device, size, read_only)?;
        let direct = match mode {
            DirectMode::Off => None,
            DirectMode::Auto | DirectMode::On => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(!read_only)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .ok()
                    .filter(|f| direct_works(f, size));
                if f.is_none() && mode == DirectMode::On {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "O_DIRECT is not supported here (direct = \"on\")",
                    ));
                }
                f
            }
        };
        let (punch_hole, zero_range) = match (read_only, block_device) {
            (true, _) => (false, false),
            (false, true) => (true, true),
            (false, false) => probe_fallocate(buffered.as_raw_fd(), size),
        };
        let rotational = block_device && rotational(&buffered);
        Ok(FileLeaf {
            buffered,
            direct,
            size,
            block_device,
            punch_hole,
            zero_range,
            rotational,
            read_only,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn caps(&self) -> Caps {
        Caps {
            flush: true,
            fua: true,
            trim: self.punch_hole,
            write_zeroes: true,
            fast_zero: self.zero_range || self.punch_hole,
            rotational: self.rotational,
            read_only: self.read_only,
        }
    }

    pub fn sync(&self) -> io::Result<()> {
        self.buffered.sync_data()
    }

    fn fd_for(&self, offset: u64, len: u32, iov: &[libc::iovec]) -> i32 {
        let aligned = offset.is_multiple_of(DIRECT_ALIGN)
            && u64::from(len) % DIRECT_ALIGN == 0
            && iov.iter().all(|v| {
                (v.iov_base as u64).is_multiple_of(DIRECT_ALIGN)
                    && (v.iov_len as u64).is_multiple_of(DIRECT_ALIGN)
            });
        match &self.direct {
            Some(d) if aligned => d.as_raw_fd(),
            _ => self.buffered.as_raw_fd(),
        }
    }

    /// Links `sqes` into a chain whose members complete silently on success.
    /// Links the SQEs in order. Not with SKIP_SUCCESS: when a request that
    /// skips its success fails, the kernel posts no completion for the
    /// linked ones it cancels, so the chain's last never completes.
    fn chain(mut sqes: Vec<squeue::Entry>) -> Prep {
        let n = sqes.len();
        for (i, e) in sqes.iter_mut().enumerate() {
            if i + 1 < n {
                *e = e.clone().flags(squeue::Flags::IO_LINK);
            }
        }
        Prep::Sqes(sqes)
    }

    fn fdatasync(&self) -> squeue::Entry {
        opcode::Fsync::new(types::Fd(self.buffered.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
    }

    pub fn prepare(&self, op: IoOp, offset: u64, len: u32, iov: &[libc::iovec]) -> Prep {
        match op {
            IoOp::Read | IoOp::Write { .. } => {
                let fd = types::Fd(self.fd_for(offset, len, iov));
                let e = if op == IoOp::Read {
                    opcode::Readv::new(fd, iov.as_ptr(), iov.len() as u32)
                        .offset(offset)
                        .build()
                } else {
                    let fua = matches!(op, IoOp::Write { fua: true });
                    opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
                        .offset(offset)
                        .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                        .build()
                };
                Prep::Sqes(vec![e])
            }
            IoOp::Flush => Prep::Sqes(vec![self.fdatasync()]),
            IoOp::Cache => Prep::Done(IoResult::Ok),
            IoOp::Trim { fua } => self.synced(Ok(self.trim(offset, len)), fua),
            IoOp::WriteZeroes {
                may_trim,
                fua,
                fast,
            } => {
                let sqes = match self.block_device {
                    true => self.block_zeroes(offset, len, fast),
                    false => self.file_zeroes(offset, len, may_trim, fast),
                };
                self.synced(sqes, fua)
            }
        }
    }

    /// `sqes` as one chain, with a data sync last for FUA; none is done.
    fn synced(&self, sqes: Result<Vec<squeue::Entry>, u32>, fua: bool) -> Prep {
        match sqes {
            Err(e) => Prep::Done(IoResult::Err(e)),
            Ok(v) if v.is_empty() => Prep::Done(IoResult::Ok),
            Ok(mut v) => {
                if fua {
                    v.push(self.fdatasync());
                }
                Self::chain(v)
            }
        }
    }

    /// TRIM as a hole punched, where the file can (a block device trims
    /// whole blocks only: the range's aligned middle). Trim is advisory:
    /// doing nothing is a valid trim.
    fn trim(&self, offset: u64, len: u32) -> Vec<squeue::Entry> {
        let (offset, len) = match self.block_device {
            true => BlockSpan::of(offset, len).middle.unwrap_or((offset, 0)),
            false => (offset, u64::from(len)),
        };
        if !self.punch_hole || len == 0 {
            return Vec::new();
        }
        let fd = types::Fd(self.buffered.as_raw_fd());
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        vec![opcode::Fallocate::new(fd, len)
            .offset(offset)
            .mode(mode)
            .build()]
    }

    /// WRITE_ZEROES on a regular file: a hole where the client allows one,
    /// else a zeroed range, else zeros written.
    fn file_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fast: bool,
    ) -> Result<Vec<squeue::Entry>, u32> {
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let mode = if may_trim && self.punch_hole {
            Some(libc::FALLOC_FL_PUNCH_HOLE | keep)
        } else if self.zero_range {
            Some(libc::FALLOC_FL_ZERO_RANGE | keep)
        } else {
            None
        };
        let fd = types::Fd(self.buffered.as_raw_fd());
        match mode {
            Some(mode) => Ok(vec![opcode::Fallocate::new(fd, u64::from(len))
                .offset(offset)
                .mode(mode)
                .build()]),
            // "...MUST fail quickly with NBD_ENOTSUP" rather than write
            // zeros: the client has a faster way of its own.
            None if fast => Err(ENOTSUP),
            None => {
                let mut v = self.zero_writes(offset, len);
                // Each zero-write linked to a successor: a short one (a full
                // disk) breaks the link, and the cancelled successor reports it.
                v.push(opcode::Nop::new().build());
                Ok(v)
            }
        }
    }

    /// WRITE_ZEROES on a block device. Its fallocate takes whole logical
    /// blocks only (EINVAL otherwise), so a range's unaligned head and tail
    /// are written as zeros. PUNCH_HOLE there zeroes only where the device
    /// can without writing (EOPNOTSUPP elsewhere), so it serves FAST_ZERO,
    /// and ZERO_RANGE, which falls back to writing zeros, serves the rest;
    /// a client's permission to trim changes nothing a raw device shows.
    fn block_zeroes(&self, offset: u64, len: u32, fast: bool) -> Result<Vec<squeue::Entry>, u32> {
        let span = BlockSpan::of(offset, len);
        if fast && span.middle.is_none() {
            // Nothing the device can zero by itself: only writes would do.
            return Err(ENOTSUP);
        }
        let mode = match fast {
            true => libc::FALLOC_FL_PUNCH_HOLE,
            false => libc::FALLOC_FL_ZERO_RANGE,
        } | libc::FALLOC_FL_KEEP_SIZE;
        let mut v = self.zero_writes(offset, span.head);
        if let Some((at, n)) = span.middle {
            let fd = types::Fd(self.buffered.as_raw_fd());
            v.push(opcode::Fallocate::new(fd, n).offset(at).mode(mode).build());
        }
        let tail_at = offset + u64::from(len) - u64::from(span.tail);
        v.extend(self.zero_writes(tail_at, span.tail));
        // A short zero-write breaks its link; a successor reports it.
        v.push(opcode::Nop::new().build());
        Ok(v)
    }

    /// WRITE_ZEROES by writing zeros, in writes of up to 16 MiB.
    fn zero_writes(&self, mut offset: u64, len: u32) -> Vec<squeue::Entry> {
        let fd = types::Fd(self.buffered.as_raw_fd());
        let iov = zero_iov();
        let mut left = len as usize;
        let mut v = Vec::new();
        while left > 0 {
            let n = left.min(ZERO_CHUNK * ZERO_IOVS);
            let full = n / ZERO_CHUNK;
            let tail = n % ZERO_CHUNK;
            if full > 0 {
                v.push(
                    opcode::Writev::new(fd, iov.as_ptr(), full as u32)
                        .offset(offset)
                        .build(),
                );
            }
            if tail > 0 {
                let off = offset + (full * ZERO_CHUNK) as u64;
                v.push(
                    opcode::Write::new(fd, ZEROS.0.as_ptr(), tail as u32)
                        .offset(off)
                        .build(),
                );
            }
            offset += n as u64;
            left -= n;
        }
        v
    }

    pub fn complete(&self, op: IoOp, len: u32, iov: &[libc::iovec], res: i32) -> IoResult {
        match (op, -res) {
            // Trim is advisory: a device that cannot discard (or the sync
            // its failure cancelled) leaves the data as it was, which a
            // trim may.
            (IoOp::Trim { .. }, libc::EOPNOTSUPP | libc::EINVAL | libc::ECANCELED) => {
                return IoResult::Ok
            }
            // A device that cannot zero without writing: "fail quickly".
            (IoOp::WriteZeroes { fast: true, .. }, libc::EOPNOTSUPP) => {
                return IoResult::Err(ENOTSUP)
            }
            // The kernel cancels the rest of a chain after a write that came
            // up short (an earlier failure would be the IO's result): a zero
            // write into a file whose filesystem filled up (below).
            (IoOp::WriteZeroes { .. }, libc::ECANCELED) if !self.block_device => {
                return IoResult::Err(ENOSPC)
            }
            _ => {}
        }
        if res < 0 {
            return IoResult::Err(match -res {
                libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
                _ => EIO,
            });
        }
        match op {
            IoOp::Read if (res as u32) < len => {
                // Past the end of a regular file smaller than its bdev: zeros.
                // Any other short read is an error rather than silent garbage.
                if self.block_device {
                    return IoResult::Err(EIO);
                }
                let mut skip = res as usize;
                for v in iov {
                    if skip >= v.iov_len {
                        skip -= v.iov_len;
                        continue;
                    }
                    // SAFETY: zeroing the unread tail of the caller's buffer.
                    unsafe {
                        std::ptr::write_bytes(
                            v.iov_base.cast::<u8>().add(skip),
                            0,
                            v.iov_len - skip,
                        )
                    };
                    skip = 0;
                }
                IoResult::Ok
            }
            // A regular file's write comes up short when its filesystem runs
            // out of room (or quota) part way: the rest would fail with
            // ENOSPC (nbdkit's file plugin writes on and answers that). The
            // spec wants ENOSPC, and qemu pauses its guest on it
            // (werror=enospc) where EIO fails the guest's write.
            IoOp::Write { .. } if (res as u32) < len && !self.block_device => IoResult::Err(ENOSPC),
            IoOp::Write { .. } if (res as u32) < len => IoResult::Err(EIO),
            _ => IoResult::Ok,
        }
    }

    /// Allocation map from SEEK_DATA/SEEK_HOLE; block devices report data.
    pub fn block_status(&self, offset: u64, len: u32) -> Vec<(u32, u32)> {
        const HOLE: u32 = crate::EXTENT_HOLE;
        if self.block_device {
            return vec![(len, 0)];
        }
        let fd = self.buffered.as_raw_fd();
        let end = offset + u64::from(len);
        let mut pos = offset;
        let mut out: Vec<(u32, u32)> = Vec::new();
        while pos < end && out.len() < 256 {
            // SAFETY: lseek on our own fd.
            let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
            let (flags, next) = if data < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                    (HOLE, end) // only a hole up to EOF
                } else {
                    (0, end) // no SEEK_DATA support: say data
                }
            } else if data as u64 > pos {
                (HOLE, data as u64)
            } else {
                // SAFETY: lseek on our own fd.
                let hole = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_HOLE) };
                (0, if hole < 0 { end } else { hole as u64 })
            };
            let next = next.clamp(pos + 1, end);
            crate::push_extent(&mut out, (next - pos) as u32, flags);
            pos = next;
        }
        out
    }
}

/// A byte range split for a block device's fallocate: the unaligned head
/// and tail (lengths) around the whole blocks between them (offset and
/// length), if any. Blocks of `DIRECT_ALIGN` cover 512-byte and 4 KiB
/// logical blocks alike.
#[derive(Debug, PartialEq)]
struct BlockSpan {
    head: u32,
    middle: Option<(u64, u64)>,
    tail: u32,
}

impl BlockSpan {
    fn of(offset: u64, len: u32) -> BlockSpan {
        let end = offset + u64::from(len);
        let start = offset.next_multiple_of(DIRECT_ALIGN);
        let stop = end - end % DIRECT_ALIGN;
        if start >= stop {
            return BlockSpan {
                head: len,
                middle: None,
                tail: 0,
            };
        }
        BlockSpan {
            head: (start - offset) as u32,
            middle: Some((start, stop - start)),
            tail: (end - stop) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::IoUring;

    struct Aligned(Vec<u8>, usize);
    impl Aligned {
        fn new(len: usize) -> Aligned {
            let v = vec![0u8; len + 4096];
            let off = (4096 - v.as_ptr() as usize % 4096) % 4096;
            Aligned(v, off)
        }
        fn slice(&mut self, len: usize) -> &mut [u8] {
            let o = self.1;
            &mut self.0[o..o + len]
        }
    }

    /// Runs a prepared IO to completion on a private ring, as the reactor
    /// does: the first error of a chain wins, else the last SQE's result. A
    /// chain whose last completion never comes fails the test.
    fn run(f: &FileLeaf, op: IoOp, offset: u64, buf: &mut [u8]) -> IoResult {
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let len = buf.len() as u32;
        let sqes = match f.prepare(op, offset, len, &iov) {
            Prep::Done(r) => return r,
            Prep::Sqes(sqes) => sqes,
        };
        let mut ring = IoUring::new(64).expect("io_uring");
        let n = sqes.len();
        for (i, e) in sqes.into_iter().enumerate() {
            let ud = if i + 1 == n { 1 } else { 0 };
            // SAFETY: buffers live until the wait below completes.
            unsafe { ring.submission().push(&e.user_data(ud)).expect("sq") };
        }
        let mut chain_error = None;
        let ts = types::Timespec::new().sec(10);
        let args = types::SubmitArgs::new().timespec(&ts);
        loop {
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                    panic!("{op:?}: the chain's last completion never came")
                }
                Err(e) => panic!("submit: {e}"),
            }
            let cqes: Vec<_> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in cqes {
                let r = f.complete(op, len, &iov, res);
                if ud == 1 {
                    return chain_error.unwrap_or(r);
                }
                if matches!(r, IoResult::Err(_)) && chain_error.is_none() {
                    chain_error = Some(r);
                }
            }
        }
    }

    fn exercise(dir: &str) {
        let Ok(tmp) = tempfile::Builder::new()
            .prefix("iopace-bdev")
            .tempfile_in(dir)
        else {
            eprintln!("skipping {dir}: not writable");
            return;
        };
        let path = tmp.path().to_str().expect("utf8 path").to_string();
        let f = FileLeaf::open(&path, Some(1 << 20), DirectMode::Auto).expect("open");
        assert_eq!(f.size(), 1 << 20);
        let mut a = Aligned::new(8192);
        // Aligned (O_DIRECT where supported) write with FUA, then read back.
        a.slice(8192).fill(0x11);
        assert_eq!(
            run(&f, IoOp::Write { fua: true }, 8192, a.slice(8192)),
            IoResult::Ok
        );
        a.slice(8192).fill(0);
        assert_eq!(run(&f, IoOp::Read, 8192, a.slice(8192)), IoResult::Ok);
        assert!(a.slice(8192).iter().all(|b| *b == 0x11));
        // Unaligned IO takes the buffered path.
        let mut odd = vec![0x22u8; 1000];
        assert_eq!(
            run(&f, IoOp::Write { fua: false }, 8193, &mut odd),
            IoResult::Ok
        );
        odd.fill(0);
        assert_eq!(run(&f, IoOp::Read, 8193, &mut odd), IoResult::Ok);
        assert!(odd.iter().all(|b| *b == 0x22));
        assert_eq!(run(&f, IoOp::Flush, 0, &mut []), IoResult::Ok);
        // Write-zeroes and trim leave zeros behind.
        let mut z = vec![0u8; 4096];
        assert_eq!(
            run(
                &f,
                IoOp::WriteZeroes {
                    may_trim: false,
                    fua: true,
                    fast: false,
                },
                8192,
                &mut z
            ),
            IoResult::Ok
        );
        let mut back = vec![1u8; 4096];
        run(&f, IoOp::Read, 8192, &mut back);
        assert!(back.iter().all(|b| *b == 0));
        if f.caps().trim {
            run(&f, IoOp::Trim { fua: false }, 12288, &mut z);
            let mut back = vec![1u8; 4096];
            run(&f, IoOp::Read, 12288, &mut back);
            assert!(back.iter().all(|b| *b == 0));
        }
        // The zero-write fallback works too (on the same open: a second
        // one is refused while this one holds the file's lock).
        let mut no_falloc = f;
        no_falloc.punch_hole = false;
        no_falloc.zero_range = false;
        let mut ones = vec![1u8; 100_000];
        run(&no_falloc, IoOp::Write { fua: false }, 0, &mut ones);
        let mut z = vec![0u8; 100_000];
        assert_eq!(
            run(
                &no_falloc,
                IoOp::WriteZeroes {
                    may_trim: true,
                    fua: true,
                    fast: false,
                },
                0,
                &mut z
            ),
            IoResult::Ok
        );
        run(&no_falloc, IoOp::Read, 0, &mut ones);
        assert!(ones.iter().all(|b| *b == 0));
        // Block status finds data and holes.
        let st = no_falloc.block_status(0, 1 << 20);
        let total: u64 = st.iter().map(|e| u64::from(e.0)).sum();
        assert_eq!(total, 1 << 20);
    }

    #[test]
    fn block_spans_split_off_unaligned_heads_and_tails() {
        let span = |offset, len| BlockSpan::of(offset, len);
        let whole = |head, at, n, tail| BlockSpan {
            head,
            middle: Some((at, n)),
            tail,
        };
        assert_eq!(span(0, 8192), whole(0, 0, 8192, 0));
        assert_eq!(span(100, 8192), whole(3996, 4096, 4096, 100));
        assert_eq!(span(4096, 4097), whole(0, 4096, 4096, 1));
        // No whole block inside: all head.
        let none = |len| BlockSpan {
            head: len,
            middle: None,
            tail: 0,
        };
        assert_eq!(span(100, 1000), none(1000));
        assert_eq!(span(4000, 4000), none(4000));
        assert_eq!(span(0, 0), none(0));
    }

    #[test]
    fn file_io_on_disk_filesystem() {
        exercise("/var/tmp");
    }

    #[test]
    fn file_io_on_tmpfs_without_o_direct() {
        exercise("/dev/shm");
    }

    /// A 1 MiB regular file served through `file`, buffered, with no
    /// fallocate modes: writes through a read-only descriptor fail as on a
    /// full disk.
    fn buffered_leaf(file: File) -> FileLeaf {
        FileLeaf {
            buffered: file,
            direct: None,
            size: 1 << 20,
            block_device: false,
            punch_hole: false,
            zero_range: false,
            rotational: false,
            read_only: false,
        }
    }

    /// A chain whose first SQE fails (a full disk under a FUA zero-write:
    /// qemu's `write -z`) still completes, with the error.
    #[test]
    fn a_failed_chain_completes_with_its_error() {
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        tmp.as_file().set_len(1 << 20).expect("size");
        // Writes through a read-only descriptor fail (EBADF), as on a full disk.
        let f = buffered_leaf(File::open(tmp.path()).expect("open read-only"));
        let mut z = vec![0u8; 64 << 10];
        for fua in [true, false] {
            let op = IoOp::WriteZeroes {
                may_trim: false,
                fua,
                fast: false,
            };
            assert_eq!(run(&f, op, 0, &mut z), IoResult::Err(EIO), "fua {fua}");
        }
        let op = IoOp::Write { fua: true };
        assert_eq!(run(&f, op, 0, &mut z), IoResult::Err(EIO));
    }

    /// A write cut short by a full filesystem is ENOSPC, as the rest of it
    /// would fail; on a block device a short write is EIO.
    #[test]
    fn a_short_write_to_a_file_is_enospc() {
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        let mut f = buffered_leaf(File::open(tmp.path()).expect("open"));
        let write = IoOp::Write { fua: false };
        let zeroes = IoOp::WriteZeroes {
            may_trim: false,
            fua: false,
            fast: false,
        };
        assert_eq!(f.complete(write, 8192, &[], 4096), IoResult::Err(ENOSPC));
        assert_eq!(f.complete(write, 8192, &[], 8192), IoResult::Ok);
        // The zero writes after a short one are cancelled.
        let cancelled = -libc::ECANCELED;
        assert_eq!(
            f.complete(zeroes, 8192, &[], cancelled),
            IoResult::Err(ENOSPC)
        );
        f.block_device = true;
        assert_eq!(f.complete(write, 8192, &[], 4096), IoResult::Err(EIO));
        assert_eq!(f.complete(zeroes, 8192, &[], cancelled), IoResult::Err(EIO));
    }

    #[test]
    fn fast_zero_without_zero_range_is_enotsup_unless_it_may_punch() {
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        let path = tmp.path().to_str().expect("utf8").to_string();
        let mut f = FileLeaf::open(&path, Some(1 << 20), DirectMode::Off).expect("open");
        (f.punch_hole, f.zero_range) = (true, false);
        let mut z = vec![0u8; 4096];
        let op = |may_trim, fast| IoOp::WriteZeroes {
            may_trim,
            fua: false,
            fast,
        };
        assert_eq!(run(&f, op(false, true), 0, &mut z), IoResult::Err(ENOTSUP));
        assert_eq!(run(&f, op(true, true), 0, &mut z), IoResult::Ok);
        assert_eq!(run(&f, op(false, false), 0, &mut z), IoResult::Ok);
    }

    #[test]
    fn a_file_it_created_and_cannot_serve_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("new.img");
        let path = path.to_str().expect("utf8");
        // Past what any filesystem holds: set_len fails after the create.
        assert!(FileLeaf::open(path, Some(i64::MAX as u64), DirectMode::Off).is_err());
        assert!(!std::path::Path::new(path).exists(), "left behind");
        // A file that was there stays, whatever happens.
        std::fs::write(path, [1u8; 4096]).expect("write");
        assert!(FileLeaf::open(path, Some(i64::MAX as u64), DirectMode::Off).is_err());
        assert_eq!(std::fs::metadata(path).expect("kept").len(), 4096);
    }

    #[test]
    fn a_file_open_elsewhere_is_refused_until_closed() {
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        let path = tmp.path().to_str().expect("utf8").to_string();
        let first = FileLeaf::open(&path, Some(1 << 20), DirectMode::Off).expect("open");
        let Err(e) = FileLeaf::open(&path, None, DirectMode::Off) else {
            panic!("a second open of a locked file succeeded");
        };
        assert!(e.to_string().contains("in use"), "{e}");
        drop(first);
        FileLeaf::open(&path, None, DirectMode::Off).expect("free again");
    }

    #[test]
    fn direct_on_fails_cleanly_where_unsupported() {
        let Ok(tmp) = tempfile::Builder::new().tempfile_in("/dev/shm") else {
            return;
        };
        let path = tmp.path().to_str().expect("utf8").to_string();
        let r = FileLeaf::open(&path, Some(1 << 20), DirectMode::On);
        if let Err(e) = r {
            assert!(e.to_string().contains("O_DIRECT"), "{e}");
        }
    }
}
