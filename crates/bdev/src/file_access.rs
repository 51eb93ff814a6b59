//! Images that can only be read: a file bdev whose image refuses a
//! read-write open (no write permission, immutable, a read-only mount) or
//! a block device set read-only is opened read-only, and only read-only
//! exports may serve it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

/// Errors of a read-write open that a read-only one may not share: a file
/// without write permission, an immutable one, one on a read-only mount.
/// qemu-nbd -r and nbdkit -r serve such images read-only.
pub(crate) fn write_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

/// Whether the existing image at `path` can only be opened read-only
/// (for `serve --check`, which opens nothing for writing).
pub(crate) fn only_readable(path: &str) -> bool {
    if is_block_device(path) {
        return File::open(path).is_ok_and(|f| device_read_only(&f));
    }
    let Ok(c) = std::ffi::CString::new(path) else {
        return false;
    };
    // SAFETY: access on a NUL-terminated path.
    let r = unsafe { libc::access(c.as_ptr(), libc::W_OK) };
    r != 0 && write_refused(&io::Error::last_os_error())
}

/// Whether `f` was opened read-only, or is a block device set read-only
/// (`blockdev --setro`, `losetup -r`, a write-protected disk), which
/// opens read-write but fails every write with EPERM; qemu-nbd refuses
/// such a device without -r ("The device is not writable").
pub(crate) fn opened_read_only(f: &File, block_device: bool) -> bool {
    // SAFETY: F_GETFL on our own descriptor.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    flags & libc::O_ACCMODE == libc::O_RDONLY || (block_device && device_read_only(f))
}

/// BLKROGET: the block device's read-only flag.
fn device_read_only(f: &File) -> bool {
    const BLKROGET: libc::c_ulong = 0x125e;
    let mut ro: libc::c_int = 0;
    // SAFETY: the ioctl writes one int into ro.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKROGET, &mut ro as *mut libc::c_int) };
    r == 0 && ro != 0
}

pub(crate) fn is_block_device(path: &str) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// A `size` past the image's length, which cannot be written.
pub(crate) fn cannot_extend(cur: u64, want: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("cannot extend it from {cur} bytes to size = {want}: it refuses writing"),
    )
}
