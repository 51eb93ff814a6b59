//! READs larger than a stream window, one buffer-sized piece at a time.
//! Each piece goes through the pacer, takes one buffer when the pacer
//! releases it, is read by the device and waits for the socket; once its
//! bytes have left, its buffer frees and the next piece starts. A READ
//! holds at most its window (`payload_cap`) of pieces however large it is:
//!
//! ```text
//! Idle ──► Pacing ──► NeedBuffer ──► Device ──► (Delayed) ──► Ready ──► Done
//! ```
//!
//! With structured replies or extended headers the reply is one
//! OFFSET_DATA chunk per piece, in order, the last one flagged DONE; a
//! piece the device fails ends it with an ERROR_OFFSET chunk at that
//! piece's offset (flagged DONE), and pieces past it are dropped as they
//! come back (`Req::chunked`, `stream_end`). A simple reply is one header
//! and the pieces' data: a device error after it was queued cannot be told
//! in a reply that promised the data, so the connection closes (a hard
//! disconnect, as the spec asks of simple replies). The request waits in
//! `Streaming` until its first piece is read, then joins its connection's
//! send queue (`Reply`) while the rest follow; nothing queued behind it is
//! sent before it ends.
//!
//! A piece leaves the pacer when its bytes are sent, as a whole READ does,
//! so the flow's window bounds what waits for the socket. A stream runs
//! alone on its connection (`turns.rs`): no READ's data waits behind it,
//! so what holds its flow's windows and the pool moves.

use pace::pacer::IoKind;
use pool::BufId;

use super::conn::{EndReason, Life};
use super::ids::{ConnId, IoToken, ReqId};
use super::states::{PieceState, ReqStage};
use super::Engine;

impl Engine {
    /// Starts the next pieces of streamed READ `id` while it holds fewer
    /// than its window.
    pub(super) fn start_stream_pieces(&mut self, id: ReqId) {
        let window = self.io.stream_window();
        loop {
            let req = &self.slots.reqs[id.index()];
            let k = req.started;
            let serving = matches!(req.state, ReqStage::Streaming | ReqStage::Reply);
            if !serving || k >= req.stream_end || req.pieces_live >= window {
                return;
            }
            if self
                .conns
                .get(req.conn)
                .is_none_or(|c| c.life != Life::Open)
            {
                return;
            }
            let req = &mut self.slots.reqs[id.index()];
            req.started += 1;
            req.pieces_live += 1;
            self.slots.set_piece(id, k, PieceState::Pacing);
            let io = self.paced_io(IoToken::piece(id, k), IoKind::Read);
            self.io.pacer.enqueue(io, self.io.now);
        }
    }

    /// Piece `k` of a streamed READ holds its buffer: to the device.
    pub(super) fn read_piece_granted(&mut self, id: ReqId, k: u32, buf: BufId) {
        self.slots.set_piece(id, k, PieceState::Device);
        let len = self.slots.reqs[id.index()].piece_len(k, self.io.buf_size);
        let req = &mut self.slots.reqs[id.index()];
        let piece = &mut req.pieces[k as usize];
        piece.buf = Some(buf);
        piece.t_submit = self.io.now;
        req.iov[k as usize] = libc::iovec {
            iov_base: self.io.pool.ptr(buf).cast(),
            iov_len: len as usize,
        };
        let io = req.io_request(bdev::IoOp::Read, Some(k), self.io.buf_size);
        let export = req.export;
        self.io.submit(IoToken::piece(id, k), export, io);
    }

    /// The device read piece `k`; an emulated delay may hold it back.
    pub(super) fn read_piece_done(&mut self, id: ReqId, k: u32) {
        if !self.delay_piece(id, k, bdev::IoOp::Read) {
            self.read_piece_ready(id, k);
        }
    }

    /// Piece `k`'s data is in its buffer (or the device failed it): the
    /// first piece puts the reply in the send queue, later ones extend it.
    pub(super) fn read_piece_ready(&mut self, id: ReqId, k: u32) {
        self.device_finished(IoToken::piece(id, k));
        let req = &self.slots.reqs[id.index()];
        let (conn, state, failed) = (req.conn, req.state, req.error != 0);
        if state == ReqStage::Dropping {
            self.drop_piece(id, k);
            self.release_dropped(id);
            return;
        }
        self.slots.set_piece(id, k, PieceState::Ready);
        let req = &mut self.slots.reqs[id.index()];
        if req.chunked() {
            req.encode_piece_chunk(k, self.io.buf_size);
            if req.pieces[k as usize].error != 0 {
                req.stream_end = req.stream_end.min(k + 1);
            }
        } else if failed {
            if let Some(c) = self.conns.get_mut(conn) {
                c.ending(EndReason::StreamFailed);
            }
            self.close(conn);
            return;
        }
        if state == ReqStage::Streaming && k == 0 {
            self.set_state(id, ReqStage::Answered);
            self.advance(id);
        } else if state == ReqStage::Reply {
            self.conns.mark_send(conn);
        }
    }

    /// `sent` bytes of streamed READ `id`'s reply have left: pieces wholly
    /// sent free their buffers, and the next pieces start.
    pub(super) fn stream_sent(&mut self, id: ReqId, sent: usize) {
        loop {
            let req = &self.slots.reqs[id.index()];
            let k = req.sent_pieces;
            // A piece not yet read has not been sent, whatever its end says
            // (a failed piece still in its emulated delay has an error but
            // no error chunk yet, so its end is the end of the one before).
            let ready = req.pieces.get(k as usize).map(|p| p.state) == Some(PieceState::Ready);
            if k >= req.stream_end || !ready || req.piece_end(k, self.io.buf_size) > sent {
                break;
            }
            self.drop_piece(id, k);
            self.slots.reqs[id.index()].sent_pieces += 1;
        }
        self.start_stream_pieces(id);
    }

    /// The connection closed under streamed READ `id` (no send in flight
    /// covers it): pieces not at the device end now, the rest as they come
    /// back; then the slot frees.
    pub(super) fn abandon_stream(&mut self, id: ReqId) {
        self.set_state(id, ReqStage::Dropping);
        let req = &self.slots.reqs[id.index()];
        for k in req.sent_pieces..req.started {
            let token = IoToken::piece(id, k).encode();
            match self.slots.reqs[id.index()].pieces[k as usize].state {
                PieceState::Ready => {}
                PieceState::Pacing => {
                    self.io.pacer.cancel(token);
                }
                PieceState::NeedBuffer => {
                    self.io.pacer.cancel(token);
                    self.io.bufs.cancel(token);
                }
                _ => continue,
            }
            self.drop_piece(id, k);
        }
        self.release_dropped(id);
    }

    /// A dropping READ frees its slot once no piece is at the device.
    fn release_dropped(&mut self, id: ReqId) {
        if self.slots.reqs[id.index()].pieces_live == 0 {
            self.release(id);
        }
    }
}

/// READ turns around streams (`turns.rs` holds each connection's `Turns`).
impl Engine {
    /// New READ `id` (paced whole, or planned as a stream): starts now if
    /// its turn has come, else waits for it.
    pub(super) fn read_turn(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.slots.reqs[id.index()].streamed();
        let conn = self.slots.reqs[id.index()].conn;
        let Some(c) = self.conns.get_mut(conn) else {
            return self.start_read(id);
        };
        if c.turns.may_start(streamed) {
            return self.start_read(id);
        }
        c.turns.wait(id);
        ReqStage::Deferred
    }

    /// READ `id`'s turn has come: a stream claims its connection, a whole
    /// READ goes to the pacer.
    fn start_read(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.slots.reqs[id.index()].streamed();
        let conn = self.slots.reqs[id.index()].conn;
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns.start(id, streamed);
        }
        if streamed {
            return ReqStage::Streaming;
        }
        let io = self.paced_io(IoToken::whole(id), IoKind::Read);
        self.io.pacer.enqueue(io, self.io.now);
        ReqStage::Pacing
    }

    /// Whole READ on `conn` queued its data to send.
    pub(super) fn read_queued(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns.queued();
        }
        self.start_deferred(conn);
    }

    /// READ `id` on `conn` ended before its data was queued, or it was a
    /// stream: the READs waiting for it may start.
    pub(super) fn read_ended(&mut self, conn: ConnId, id: ReqId) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns.ended(id);
        }
        self.start_deferred(conn);
    }

    /// Starts the READs waiting on `conn` whose turn has come, in order.
    fn start_deferred(&mut self, conn: ConnId) {
        loop {
            let Some(c) = self.conns.get_mut(conn) else {
                return;
            };
            // A closing connection's waiting READs are aborted, not started.
            if c.life != Life::Open {
                return;
            }
            let reqs = &self.slots.reqs;
            let Some(id) = c.turns.next(|r| reqs[r.index()].streamed()) else {
                return;
            };
            let to = self.start_read(id);
            self.set_state(id, to);
            self.advance(id);
        }
    }
}
