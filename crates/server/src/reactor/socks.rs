//! A reactor's sockets, one per connection slot, and the sends that
//! splice lent READ data (a RAM export's pages) through a pipe instead of
//! copying it into the socket. This owns file descriptors and pipes; the
//! reactor turns what it reports ([`Drained`]) into SQEs and engine events.

use std::os::fd::{AsRawFd, OwnedFd};

use config::SpliceMode;

use crate::engine::{ConnId, Sent};
use crate::sockets::{
    is_nonblocking, is_unix, set_nonblocking, set_notsent_lowat, set_send_buffer,
};
use crate::splice::{self, Pipe};

/// A connection's socket, with its pipe while it splices.
struct Sock {
    conn: ConnId,
    fd: OwnedFd,
    /// Whether this connection's sends with lent data splice.
    splices: bool,
    /// Created on the first splicing send.
    pipe: Option<Pipe>,
    /// The bytes the send in flight put into the pipe: reported once the
    /// pipe is empty.
    pipe_send: usize,
}

/// The send-side options of accepted sockets; 0 keeps the kernel's.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendBuffers {
    /// SO_SNDBUF of Unix-socket connections.
    pub unix: usize,
    /// SO_SNDBUF of TCP connections.
    pub tcp: usize,
    /// TCP_NOTSENT_LOWAT of TCP connections: a send waits (in io_uring's
    /// poll, or the splice's) while the socket holds this much unsent, so
    /// a reply counts as sent only once the queue before it has mostly
    /// gone to the wire.
    pub tcp_notsent_lowat: usize,
}

/// TCP_NOTSENT_LOWAT of TLS connections whose configuration sets none
/// (see [`Socks::tls_started`]).
const TLS_NOTSENT_LOWAT: usize = 1 << 20;

/// What draining a connection's pipe came to.
pub(super) enum Drained {
    /// The splicing send is over: report it to the engine.
    Sent(Sent),
    /// The socket is full: poll this fd for room and drain again.
    WaitRoom(i32),
}

pub(super) struct Socks {
    /// The reactor's index, for logs.
    id: usize,
    /// Sockets by connection slot, with the connection they belong to.
    socks: Vec<Option<Sock>>,
    splice: SpliceMode,
    send_buffers: SendBuffers,
    /// Memory the catalog's bdevs lend (address, length), sorted: only
    /// this is spliced by reference.
    lendable: Vec<(usize, usize)>,
}

impl Socks {
    pub(super) fn new(
        id: usize,
        splice: SpliceMode,
        send_buffers: SendBuffers,
        lendable: Vec<(usize, usize)>,
    ) -> Socks {
        Socks {
            id,
            socks: Vec::new(),
            splice,
            send_buffers,
            lendable,
        }
    }

    /// The connection's socket, if it is still the one in its slot.
    pub(super) fn fd(&self, conn: ConnId) -> Option<i32> {
        match self.socks.get(conn.index as usize) {
            Some(Some(s)) if s.conn == conn => Some(s.fd.as_raw_fd()),
            _ => None,
        }
    }

    fn get_mut(&mut self, conn: ConnId) -> Option<&mut Sock> {
        match self.socks.get_mut(conn.index as usize) {
            Some(Some(s)) if s.conn == conn => Some(s),
            _ => None,
        }
    }

    /// Takes the socket of new connection `conn` and sets it up: its send
    /// buffer, and whether (and so non-blocking) it splices.
    pub(super) fn add(&mut self, conn: ConnId, fd: OwnedFd) {
        let i = conn.index as usize;
        if self.socks.len() <= i {
            self.socks.resize_with(i + 1, || None);
        }
        let unix = is_unix(&fd);
        let splices = match self.splice {
            SpliceMode::Off => false,
            SpliceMode::Unix => unix,
            SpliceMode::All => true,
        } && !self.lendable.is_empty();
        let b = self.send_buffers;
        let send_buffer = if unix { b.unix } else { b.tcp };
        if send_buffer > 0 {
            set_send_buffer(&fd, send_buffer);
        }
        if !unix && b.tcp_notsent_lowat > 0 {
            set_notsent_lowat(&fd, b.tcp_notsent_lowat);
        }
        // Splicing never blocks the reactor: a full socket fails it with
        // EAGAIN, and the reactor polls. (io_uring's own sends and receives
        // wait in the kernel whatever the flag.)
        if splices && !set_nonblocking(&fd) {
            tracing::warn!(reactor = self.id, "O_NONBLOCK failed: sending by copy");
        }
        let splices = splices && is_nonblocking(&fd);
        // A socket still here belongs to a closed connection whose Close is
        // not yet executed: dropping it closes it, and the Close skips it.
        self.socks[i] = Some(Sock {
            conn,
            fd,
            splices,
            pipe: None,
            pipe_send: 0,
        });
    }

    /// The connection `conn` starts TLS. A TCP socket whose configuration
    /// sets no `tcp_notsent_lowat` gets [`TLS_NOTSENT_LOWAT`]: a
    /// ciphertext send then waits in the kernel while the socket holds
    /// that much the client has not taken, and the TLS session receives
    /// no requests meanwhile (`super::tls`), so a client slower than the
    /// reactor has its requests read, answered and sent in batches, not
    /// one wake-up each.
    pub(super) fn tls_started(&self, conn: ConnId) {
        let Some(Some(s)) = self.socks.get(conn.index as usize) else {
            return;
        };
        if s.conn == conn && self.send_buffers.tcp_notsent_lowat == 0 && !is_unix(&s.fd) {
            set_notsent_lowat(&s.fd, TLS_NOTSENT_LOWAT);
        }
    }

    /// Closes the connection's socket if it is still in its slot.
    pub(super) fn close(&mut self, conn: ConnId) {
        if self.fd(conn).is_some() {
            self.socks[conn.index as usize] = None; // drops and closes the fd
        }
    }

    /// Sends `msg` through the connection's pipe if it splices and the
    /// message carries lent data worth it, and drains the pipe; `None`:
    /// send it as usual.
    pub(super) fn splice_send(
        &mut self,
        conn: ConnId,
        msg: *const libc::msghdr,
    ) -> Option<Drained> {
        let id = self.id;
        let lendable = &self.lendable;
        let lent = |v: &libc::iovec| {
            let (p, n) = (v.iov_base as usize, v.iov_len);
            lendable.iter().any(|&(b, l)| p >= b && p + n <= b + l)
        };
        let sock = match self.socks.get_mut(conn.index as usize) {
            Some(Some(s)) if s.conn == conn => s,
            _ => return None,
        };
        if !sock.splices {
            return None;
        }
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // the send is reported.
        let iovs = unsafe {
            let m = &*msg;
            std::slice::from_raw_parts(m.msg_iov, m.msg_iovlen)
        };
        if splice::ref_bytes(iovs, lent) == 0 {
            return None;
        }
        if sock.pipe.is_none() {
            match Pipe::new() {
                Ok(p) => sock.pipe = Some(p),
                Err(e) => {
                    tracing::warn!(reactor = id, "no pipe, sending by copy: {e}");
                    sock.splices = false;
                    return None;
                }
            }
        }
        let pipe = sock.pipe.as_mut()?;
        // SAFETY: the iovecs are readable (the engine's); `lent` accepts only
        // a bdev's mapping, whose pages may be referenced past the send.
        match unsafe { pipe.fill(iovs, lent) } {
            Ok(n) if n > 0 => sock.pipe_send = n,
            Ok(_) => return None,
            Err(e) => {
                tracing::debug!(
                    reactor = id,
                    "filling the pipe failed, sending by copy: {e}"
                );
                return None;
            }
        }
        self.drain_pipe(conn)
    }

    /// Splices the connection's pipe into its socket: the send is over once
    /// the pipe is empty (or failed), or the socket needs room first.
    /// `None`: no such connection or pipe any more.
    pub(super) fn drain_pipe(&mut self, conn: ConnId) -> Option<Drained> {
        let sock = self.get_mut(conn)?;
        let fd = sock.fd.as_raw_fd();
        let pipe = sock.pipe.as_mut()?;
        Some(match pipe.drain_to(fd) {
            Ok(true) => Drained::Sent(Sent::Bytes(std::mem::take(&mut sock.pipe_send))),
            Ok(false) => Drained::WaitRoom(fd),
            Err(e) => {
                // What is left in the pipe never goes: drop it (and its
                // page references) with the pipe.
                sock.pipe = None;
                sock.pipe_send = 0;
                Drained::Sent(Sent::Error(e.raw_os_error().unwrap_or(libc::EIO)))
            }
        })
    }

    /// The poll for room failed: the splicing send is over, its pipe gone.
    /// False: no such connection any more.
    pub(super) fn splice_failed(&mut self, conn: ConnId) -> bool {
        let Some(sock) = self.get_mut(conn) else {
            return false;
        };
        sock.pipe = None;
        sock.pipe_send = 0;
        true
    }
}
