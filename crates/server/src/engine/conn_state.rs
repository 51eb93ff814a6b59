//! The parts of a connection's state, each an enum its `Conn` moves
//! through one checked setter (`conn.rs`): its protocol phase, what its
//! input parser expects next, its receive and send operations, its life and
//! why it ended; and what a pass over its input did.

use proto::{Handshake, Negotiated};

use super::ids::ReqId;
use super::nvme_conn::NvmeConn;

/// The connection's protocol and where it is in it.
pub enum Phase {
    /// NBD, negotiating.
    Handshake(Box<Handshake>),
    /// NBD, serving an export; `meta` are the sources of the metadata
    /// contexts it selected, with their ids.
    Transmission {
        export: u16,
        neg: Negotiated,
        meta: Vec<(u32, crate::exports::MetaSource)>,
    },
    /// NVMe/TCP, its queue in front (`engine/nvme.rs`).
    Nvme(Box<NvmeConn>),
}

/// What the next request header in a connection's buffer is.
pub enum Header {
    /// Not whole yet, or the connection holds its share of the pool.
    Wait,
    /// Not a request: the connection must close.
    Bad(proto::DecodeError),
    /// NBD_CMD_DISC (consumed): no reply; serve what is in flight, then close.
    Disc,
    /// A request, and its header's length (not consumed yet).
    Request(proto::Request, usize),
}

/// What one pass over a connection's buffered input did next.
pub enum Step {
    /// Consumed something; look again.
    Again,
    /// Needs more bytes, or is waiting for something else.
    Stop,
}

/// What the connection's next input bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Handshake bytes.
    Handshake,
    /// STARTTLS was acknowledged: once the answer has left, the driver runs
    /// the TLS handshake (`Action::StartTls`), then handshake bytes again.
    StartTls,
    /// Request headers.
    Headers,
    /// Request headers, but no request slot is free: the connection waits in
    /// the engine's slot queue.
    WaitSlot,
    /// The payload of this WRITE.
    Payload(ReqId),
    /// This many payload bytes of a rejected WRITE, to be discarded.
    Discard(u64),
    /// NVMe/TCP PDUs, which its queue parses.
    Pdus,
    /// Nothing more: EOF, DISC, a failed handshake, or the server draining.
    Ended,
}

/// The receive side's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvOp {
    Idle,
    /// Into the receive buffer.
    Buffered,
    /// Straight into a WRITE's payload buffer.
    Direct(ReqId),
    /// Straight into an NVMe/TCP WRITE's buffers: the data of the H2CData
    /// PDU arriving for it (`NvmeConn::h2c_target`).
    H2c(ReqId),
    /// The driver runs the TLS handshake; it reports with `Engine::on_tls`.
    Tls,
}

/// The send side's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Idle,
    /// In the engine's list of connections to send for.
    Ready,
    InFlight,
}

/// A connection's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Life {
    /// Serving.
    Open,
    /// Shut down: everything left is released as it completes, then the
    /// socket closes.
    Closing,
}

/// Why a connection ended, for its close log: the first cause seen stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The client closed its side (EOF).
    ClientClosed,
    /// The client sent NBD_CMD_DISC (or an NVMe/TCP H2CTermReq).
    Disconnect,
    /// The NVMe controller it served is gone (keep-alive expired, reset,
    /// shut down, or its admin queue closed).
    ControllerGone,
    /// The handshake ended without an export (aborted, refused or failed).
    HandshakeEnded,
    /// A request the protocol does not allow.
    ProtocolError,
    /// A rejected WRITE with more payload than is worth discarding.
    RejectedWrite,
    /// The handshake, idle or payload timeout.
    Timeout,
    /// A streamed READ failed at the device after its header promised the data.
    StreamFailed,
    RecvError,
    SendError,
    /// The TLS handshake failed (the driver logs why).
    TlsFailed,
    /// The server shut down and drained it.
    Draining,
    /// The server's drain timeout closed it.
    DrainTimeout,
}

/// What a connection did, for its close log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Traffic {
    /// Replies sent.
    pub replies: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}
