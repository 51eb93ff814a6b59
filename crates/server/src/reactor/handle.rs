//! The part of a reactor other threads touch: its inbox of messages and
//! the eventfd that wakes it, and its count of live connections.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc, Mutex};

use pace::pacer::PacingConfig;

use crate::stats::ReactorStats;

/// A connection an acceptor took: its socket, its peer's description, and
/// the target port it came in on where the pacers know it (its listener's
/// `gbps`, see `config::WirePorts`).
pub struct Accepted {
    pub fd: OwnedFd,
    pub peer: String,
    pub port: Option<usize>,
}

/// Messages from other threads, delivered through the inbox and an eventfd.
pub enum Msg {
    /// An NBD connection.
    NewConn(Accepted),
    /// An NVMe/TCP connection.
    NewNvme(Accepted),
    /// A connection with a handshake of its own: a TLS listener's (which
    /// offers STARTTLS; the reactor then runs TLS on the fd, `reactor::tls`)
    /// or one under access rules for its address.
    Resume(Accepted, Box<proto::Handshake>),
    Stats(mpsc::Sender<ReactorStats>),
    /// The requests in flight a trace query names, with their state changes.
    Trace(
        crate::engine::TraceQuery,
        mpsc::Sender<Vec<crate::engine::TracedReq>>,
    ),
    SetPacing(PacingConfig),
    Shutdown,
}

/// The part of a reactor other threads may touch.
pub struct ReactorHandle {
    pub(super) eventfd: OwnedFd,
    pub(super) inbox: Mutex<Vec<Msg>>,
    /// Live connections, read by the acceptor to balance reactors.
    pub conns: AtomicUsize,
}

impl ReactorHandle {
    pub fn new() -> io::Result<Arc<ReactorHandle>> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(ReactorHandle {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
            inbox: Mutex::new(Vec::new()),
            conns: AtomicUsize::new(0),
        }))
    }

    pub fn send(&self, msg: Msg) {
        if let Ok(mut inbox) = self.inbox.lock() {
            inbox.push(msg);
        }
        self.wake();
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd. A full
        // counter (EAGAIN) still means the reactor will wake.
        unsafe {
            libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }
}
