//! The states of a request slot and of its pieces: one enum each, whose
//! transitions `slots.rs` checks. A request's (`Requests::advance` moves it,
//! `request.rs`; the piece diagram is in `pieces.rs`):
//!
//! ```text
//! New ──► Pacing ──► Released ──► NeedBuffers ──► Ready ──► Device ──► Executed ──► Delayed
//!  │        (pacer)     │          (pool)          ▲  │                   │            │
//!  │                    └──────────────────────────┘  │ (no device)       ▼            │
//!  ├──► Payload (WRITE pieces) ───────────────────────┴──────────────► Answered ◄─────┘
//!  │   Released, NeedBuffers ──► Receiving (an NVMe WRITE's data) ──► Ready, Answered
//!  ├──► Streaming (large READ pieces) ──────────────────────────────────► │
//!  ├──► Deferred (a READ waiting for its turn around a stream) ──► Pacing, Streaming
//!  └──► Ready (FLUSH, TRIM, ...)                                          │
//!        ▲  Executed, Delayed ──► Ready: the next piece of a long TRIM,   │
//!        └─ WRITE_ZEROES or CACHE (`next_piece`)                          │
//!                                                    Free ◄── Sent ◄── Reply (send queue)
//!  Streaming, Answered, Reply ──► Dropping (connection closed) ──► Free
//!  Pacing, NeedBuffers, Payload, Receiving, Answered, Reply ──► Free (connection closed)
//! ```

use pace::stats::StatState;
use pace::Nanos;
use pool::BufId;

/// Where a request is in its life. Waiting states name the one queue the
/// request is in (the pacer's, the pool's, the device, the delay timers, its
/// WRITE pieces, its connection's send queue); transient states are where an
/// event left it for `Requests::advance` (`request.rs`) to move on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqStage {
    /// The slot is free.
    Free,
    /// Transient: header decoded and valid.
    New,
    /// Waiting: a READ whose connection serves a streamed READ, or one
    /// that waits for the READs before it to finish (`turns.rs`).
    Deferred,
    /// Waiting: a READ queued in the pacer; no buffer held yet.
    Pacing,
    /// Transient: the pacer released the READ.
    Released,
    /// Waiting: queued in the pool for the READ's buffers.
    NeedBuffers,
    /// Transient: holds what it needs; goes to the device.
    Ready,
    /// Waiting: at the device (a READ, or a command without data).
    Device,
    /// Transient: the device is done.
    Executed,
    /// Waiting: an emulated delay holds the completion back.
    Delayed,
    /// Waiting: a WRITE whose payload is arriving or whose pieces are at the
    /// device; each piece has its own state.
    Payload,
    /// Waiting: an NVMe/TCP WRITE holds its buffers; its R2T is out and
    /// its data arrives into them.
    Receiving,
    /// Waiting: a READ too large for its buffers at once, read piece by
    /// piece; it joins the send queue once its first piece is read.
    Streaming,
    /// Waiting: a streamed READ whose connection closed; its pieces still at
    /// the device come back before the slot frees.
    Dropping,
    /// Transient: the reply is decided (result or error).
    Answered,
    /// Waiting: the reply is queued on the connection or being sent.
    Reply,
    /// Transient: the reply has left.
    Sent,
}

impl ReqStage {
    /// The label the statistics count this state under.
    pub fn stat(self) -> StatState {
        match self {
            ReqStage::Free => StatState::Done,
            ReqStage::New => StatState::New,
            ReqStage::Deferred | ReqStage::Pacing => StatState::Pacing,
            ReqStage::Released | ReqStage::NeedBuffers => StatState::NeedBuffer,
            ReqStage::Ready
            | ReqStage::Device
            | ReqStage::Executed
            | ReqStage::Delayed
            | ReqStage::Streaming => StatState::Executing,
            ReqStage::Payload
            | ReqStage::Receiving
            | ReqStage::Answered
            | ReqStage::Reply
            | ReqStage::Sent
            | ReqStage::Dropping => StatState::Transfer,
        }
    }
}

/// One buffer-sized piece of a WRITE payload or of a streamed READ. Pieces
/// start in order; each takes one buffer and goes to the device as its own IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceState {
    /// Not started: no pacer entry, no buffer.
    Idle,
    /// Queued in the pacer.
    Pacing,
    /// Released by the pacer, queued in the pool for its buffer.
    NeedBuffer,
    /// A WRITE piece holds its buffer; payload bytes arrive into it.
    Filling,
    /// Its IO is at the device.
    Device,
    /// The device is done; an emulated delay holds the completion back.
    Delayed,
    /// A READ piece's data is in its buffer, waiting for the socket.
    Ready,
    /// Written, sent (or failed, or abandoned); its buffer is back in the pool.
    Done,
}

/// One piece of a request: its state and what it holds.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    pub state: PieceState,
    pub buf: Option<BufId>,
    pub t_submit: Nanos,
    /// NBD errno the device failed it with, 0 for success.
    pub error: u32,
}
