//! The size a file bdev serves: a regular file's (grown to a configured
//! `size`, never shrunk), or a block device's own, and what `serve
//! --check` says of it without opening anything for writing.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use crate::file_access::{cannot_extend, only_readable};

fn ioctl_u64(fd: i32, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the ioctl writes one u64 into v.
    let r = unsafe { libc::ioctl(fd, req, &mut v as *mut u64) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// The size a regular file of `current` bytes gets for a configured `size`:
/// a smaller `size` is refused, since serving less than the file would hide data.
fn planned_file_size(current: u64, size: Option<u64>) -> io::Result<u64> {
    match size {
        Some(want) if want < current => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the file has {current} bytes, more than size = {want}: raise size or remove it"
            ),
        )),
        Some(want) => Ok(want),
        None => Ok(current),
    }
}

/// A block device is served whole: a `size` other than its own would serve
/// less than it holds, or promise clients bytes it has not.
fn block_device_size(device: u64, size: Option<u64>) -> io::Result<u64> {
    match size {
        Some(want) if want != device => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the block device has {device} bytes, not size = {want}: remove size"),
        )),
        _ => Ok(device),
    }
}

/// The length of the regular file at `path` when it is larger than `size`.
pub fn larger_than(path: &str, size: Option<u64>) -> Option<u64> {
    let m = std::fs::metadata(path).ok()?;
    (m.is_file() && size.is_some_and(|want| want < m.len())).then_some(m.len())
}

/// A regular file image of `size` bytes at `path` whose unwritten part is
/// more than its filesystem has free: `(unwritten, free)` bytes. Such a
/// sparse (thin) image is served, as qemu and nbdkit serve one; writes into
/// its holes fail with ENOSPC once the filesystem is full. None when it
/// fits, for block devices, and when the filesystem cannot say.
pub fn thin_shortfall(path: &str, size: u64) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let p = std::path::Path::new(path);
    let allocated = match std::fs::metadata(p) {
        Ok(m) if m.is_file() => m.blocks() * 512,
        Ok(_) => return None,
        Err(_) => 0,
    };
    let dir = if p.exists() {
        p
    } else {
        p.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."))
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes the struct it is given; the path is a C string.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let unwritten = size.saturating_sub(allocated);
    (unwritten > free).then_some((unwritten, free))
}

/// A block device opened with O_EXCL is claimed: the open fails (EBUSY)
/// while a mounted filesystem, LVM, md or another exclusive user holds
/// it, whose data the clients' writes would corrupt under it.
pub(crate) fn claimed(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EBUSY) => io::Error::new(
            io::ErrorKind::ResourceBusy,
            "in use: a mounted filesystem or another program (LVM, md, a server, \
             or another bdev of this config) holds this block device; unmount or \
             release it first (a `split` bdev serves parts of one device)",
        ),
        _ => e,
    }
}

/// What [`FileLeaf::open`] would serve, found without creating, extending or
/// opening the file for writing (for `serve --check`).
pub fn planned_size(path: &str, size: Option<u64>) -> io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => {
            let f = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(path)
                .map_err(claimed)?;
            block_device_size(ioctl_u64(f.as_raw_fd(), BLKGETSIZE64)?, size)
        }
        Ok(m) if m.is_file() => match planned_file_size(m.len(), size)? {
            want if want > m.len() && only_readable(path) => Err(cannot_extend(m.len(), want)),
            want => Ok(want),
        },
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file or block device",
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound && size.is_some() => {
            let parent = std::path::Path::new(path)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            if parent.is_dir() {
                Ok(size.unwrap_or(0))
            } else {
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("directory {} does not exist", parent.display()),
                ))
            }
        }
        Err(e) => Err(e),
    }
}
/// The size a file bdev serves: a block device's own, or a regular
/// file's, extended to a larger configured `size` (which a file opened
/// read-only cannot be).
pub(crate) fn served_size(
    f: &File,
    block_device: bool,
    size: Option<u64>,
    read_only: bool,
) -> io::Result<u64> {
    if block_device {
        return block_device_size(ioctl_u64(f.as_raw_fd(), BLKGETSIZE64)?, size);
    }
    let cur = f.metadata()?.len();
    let want = planned_file_size(cur, size)?;
    if want > cur && read_only {
        return Err(cannot_extend(cur, want));
    }
    if want > cur {
        f.set_len(want)?;
    }
    Ok(want)
}
