//! What passes between the engine and its driver: how a connection opens,
//! the engine's settings, the actions the driver carries out, and the
//! outcomes it reports back.

use bdev::IoRequest;
use pace::Nanos;

use super::ids::{ConnId, IoToken};

/// How a new connection begins.
pub enum Opening {
    /// NBD: a fresh handshake, or one already under way (a connection
    /// handed over mid-negotiation).
    Nbd(Option<Box<proto::Handshake>>),
    /// NVMe/TCP: the host's ICReq comes first.
    Nvme,
}

/// Time limits on a connection, enforced with the engine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From accept to the end of the handshake.
    pub handshake: Nanos,
    /// A connection with no request in flight and no bytes arriving; 0:
    /// no limit.
    pub idle: Nanos,
    /// A WRITE payload (or a rejected one being discarded) with no bytes arriving.
    pub payload: Nanos,
}

pub struct EngineSettings {
    pub id: usize,
    pub max_requests: u32,
    /// At shutdown, how long to wait for in-flight requests before closing.
    pub drain_timeout: Nanos,
    pub timeouts: Timeouts,
    /// WRITE pieces one connection may have waiting for their payload at
    /// once, and buffers one streamed READ may hold at once.
    pub payload_cap: u32,
}

/// WRITE pieces one connection may have waiting for their payload (in the
/// pacer, for a buffer, or filling one) at once: enough to keep a payload
/// streaming, few enough that a stalled writer holds almost nothing. Pieces
/// whose payload is in are the pacer's to bound.
pub const PAYLOAD_CAP: u32 = 4;

/// What the driver must do. Pointers in here point at memory the engine owns
/// and keeps in place until the matching completion is fed back.
#[derive(Debug)]
pub enum Action {
    /// Receive up to `len` bytes into `buf`; report with [`super::Engine::on_recv`].
    Recv {
        conn: ConnId,
        buf: *mut u8,
        len: usize,
    },
    /// `sendmsg` this header (its iovecs); report with [`super::Engine::on_send`].
    Send {
        conn: ConnId,
        msg: *const libc::msghdr,
    },
    /// Submit `req` to export `export`'s bdev; report with [`super::Engine::on_io_done`].
    Submit {
        io: IoToken,
        export: u16,
        req: IoRequest,
    },
    /// Shut the socket down (both ways, or only reading) so pending
    /// operations complete.
    Shutdown { conn: ConnId, read_only: bool },
    /// Nothing is in flight on this socket any more: close it.
    Close { conn: ConnId },
    /// STARTTLS was answered: run the TLS handshake on this connection, and
    /// from then on receive and send through TLS; report the handshake
    /// with [`super::Engine::on_tls`].
    StartTls { conn: ConnId },
}

/// How a connection's TLS handshake ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsOutcome {
    /// Up; with the common name of the client's certificate, if it sent one.
    Up {
        cert_name: Option<String>,
    },
    Failed,
}

/// A receive's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    Data(usize),
    Eof,
    /// An errno.
    Error(i32),
}

/// A send's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Bytes(usize),
    /// An errno.
    Error(i32),
}
