//! Unix socket files: never replace anything but a stale socket, bind the
//! admin socket private whatever the umask, and remove what a run created.
//! And the options the reactors set on accepted sockets.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Makes `path` free for a new socket: nothing there, or a socket nobody
/// listens on (left by a crashed run), which is removed. Anything else (a
/// regular file, a directory, a live socket) is an error and is left alone.
pub fn claim_socket_path(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; refusing to replace it",
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another server is listening there",
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(e),
    }
}

/// Binds a listening socket at `path` (see [`claim_socket_path`]).
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    claim_socket_path(path)?;
    UnixListener::bind(path)
}

/// Binds a socket at `path` that only its owner can connect to, whatever the
/// umask: it is bound in a fresh 0700 directory beside `path`, made 0600
/// there, then renamed into place, so it is never reachable with looser modes.
pub fn bind_private(path: &Path) -> io::Result<UnixListener> {
    claim_socket_path(path)?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let staging = parent.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map(|_| ())?;
    let staged = staging.join("s");
    let result = UnixListener::bind(&staged).and_then(|l| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&staging);
    result
}

use std::os::unix::fs::DirBuilderExt as _;

/// Socket files this run created; removed when dropped, so a failed start
/// leaves nothing behind and a clean stop removes them too.
#[derive(Default)]
pub struct SocketFiles(Vec<PathBuf>);

impl SocketFiles {
    pub fn add(&mut self, path: &Path) {
        self.0.push(path.to_path_buf());
    }
}

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            // Only our own socket: something else may have replaced it since.
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The uid of the process at the other end of a Unix socket.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let r = libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        );
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cred.uid)
    }
}

/// Whether `fd` is a Unix-domain socket.
pub(crate) fn is_unix(fd: &OwnedFd) -> bool {
    // SAFETY: getsockname into a zeroed sockaddr_storage of its size.
    unsafe {
        let mut addr: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        ) == 0
            && i32::from(addr.ss_family) == libc::AF_UNIX
    }
}

/// SO_SNDBUF of `fd` (logged, not fatal, when refused).
pub(crate) fn set_send_buffer(fd: &OwnedFd, bytes: usize) {
    set_int_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes, "SO_SNDBUF");
}

/// TCP_NOTSENT_LOWAT of `fd` (logged, not fatal, when refused).
pub(crate) fn set_notsent_lowat(fd: &OwnedFd, bytes: usize) {
    let name = libc::TCP_NOTSENT_LOWAT;
    set_int_option(fd, libc::IPPROTO_TCP, name, bytes, "TCP_NOTSENT_LOWAT");
}

/// An int socket option, `value` capped at `i32::MAX`; a refusal is
/// logged, not fatal (the kernel's default stays).
fn set_int_option(fd: &OwnedFd, level: i32, name: i32, value: usize, what: &str) {
    let v = value.min(i32::MAX as usize) as i32;
    // SAFETY: setsockopt with a valid int.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!("{what} {value}: {}", io::Error::last_os_error());
    }
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> bool {
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    }
}

pub(crate) fn is_nonblocking(fd: &OwnedFd) -> bool {
    // SAFETY: fcntl on our own descriptor.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_socket_takes_its_notsent_lowat() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let fd = OwnedFd::from(client);
        set_notsent_lowat(&fd, 128 << 10);
        let mut v: i32 = 0;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: getsockopt into a valid int.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(v, 128 << 10);
    }

    #[test]
    fn a_regular_file_is_never_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("important.txt");
        std::fs::write(&path, b"keep me").expect("write");
        assert!(bind(&path).is_err());
        assert!(bind_private(&path).is_err());
        assert_eq!(std::fs::read(&path).expect("still there"), b"keep me");
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let live = bind(&path).expect("bind");
        assert!(bind(&path).is_err(), "someone listens there");
        drop(live);
        let _again = bind(&path).expect("stale socket replaced");
    }

    #[test]
    fn the_private_socket_is_0600_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        // SAFETY: umask is process-wide; this test restores it at once.
        let old = unsafe { libc::umask(0) };
        let l = bind_private(&path);
        unsafe { libc::umask(old) };
        let _l = l.expect("bind");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let leftovers = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(leftovers, 1, "no staging directory left");
    }

    #[test]
    fn socket_files_are_removed_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let mut files = SocketFiles::default();
        let _l = bind(&path).expect("bind");
        files.add(&path);
        drop(files);
        assert!(!path.exists());
    }
}
