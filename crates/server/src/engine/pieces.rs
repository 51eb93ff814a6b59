//! Pieces: a request's data one buffer-sized piece at a time, for WRITE
//! payloads and for READs too large for their buffers at once (streamed).
//! These are operations of [`Pieces`], over the slot table, the connections
//! and the IO path; what they leave to the request
//! machine comes back as a [`Then`] (`Requests::pieces` carries it out).
//!
//! A piece goes through the pacer, takes one buffer and goes to the device
//! as its own IO. A WRITE piece receives its bytes before that; the reply
//! goes when every piece is written. A connection holds at most
//! `payload_cap` WRITE pieces waiting for their payload at once, so a
//! writer that stalls mid-payload holds at most that many buffers:
//!
//! ```text
//! WRITE: Idle ──► Pacing ──► NeedBuffer ──► Filling ──► Device ──► (Delayed) ──► Done
//! READ:  Idle ──► Pacing ──► NeedBuffer ──► Device ──► (Delayed) ──► Ready ──► Done
//! ```
//!
//! A streamed READ is larger than a stream window. Each piece goes through
//! the pacer, takes one buffer when the pacer releases it, is read by the
//! device and waits for the socket; once its bytes have left, its buffer
//! frees and the next piece starts. A READ holds at most its window
//! (`payload_cap`) of pieces however large it is.
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
use pool::{Alloc, BufId};
use proto::Command;

use super::conn_state::{EndReason, Input, Life, RecvOp};
use super::conns::Conns;
use super::framing::ReplyStyle;
use super::ids::{ConnId, IoToken, ReqId};
use super::io_path::IoPath;
use super::nvme_data;
use super::slot::Req;
use super::slots::Slots;
use super::states::{PieceState, ReqStage};

/// Whether streamed READ `req` holds every buffer it will take: each piece
/// up to its end has started, and none waits for the pacer or a buffer.
pub(super) fn all_buffered(req: &Req) -> bool {
    let end = req.stream_end() as usize;
    req.started() as usize >= end
        && req.pieces()[..end]
            .iter()
            .all(|p| !matches!(p.state, PieceState::Pacing | PieceState::NeedBuffer))
}

/// The piece machinery over the parts it moves: the request slots, their
/// connections and the IO path (as `audit::Books` reads them).
pub struct Pieces<'e> {
    slots: &'e mut Slots,
    conns: &'e mut Conns,
    io: &'e mut IoPath,
}

/// What a piece event leaves to the request machine (`Requests::pieces`).
#[must_use]
pub enum Then {
    /// Nothing more.
    Done,
    /// The request moved on (to `Answered`): advance it.
    Advance(ReqId),
    /// The request is over: free its slot.
    Release(ReqId),
    /// A streamed READ failed after its header promised the data: close
    /// its connection.
    Close(ConnId),
}

impl<'e> Pieces<'e> {
    pub fn new(slots: &'e mut Slots, conns: &'e mut Conns, io: &'e mut IoPath) -> Pieces<'e> {
        Pieces { slots, conns, io }
    }

    fn set_state(&mut self, id: ReqId, to: ReqStage) {
        let now = self.io.now();
        (self.slots).set_state(id, to, self.io.stats_mut(), now);
    }

    /// Queues piece or request `token` in the pacer, as its connection's flow.
    pub fn enqueue(&mut self, token: IoToken, kind: IoKind) {
        let req = &self.slots[token.req];
        let flow = self.conns.get(req.conn()).map_or(0, |c| c.flow());
        let paced = self.io.paced_io(req, token, flow, kind);
        let now = self.io.now();
        self.io.pacer_mut().enqueue(paced, now);
    }

    /// Starts the next pieces of `id`'s payload while its connection has room.
    pub fn start_pieces(&mut self, id: ReqId) {
        let conn = self.slots[id].conn();
        loop {
            let req = &self.slots[id];
            let k = req.started();
            if k as usize >= req.pieces().len() || req.state() != ReqStage::Payload {
                return;
            }
            let cap = self.io.payload_cap();
            let Some(c) = self.conns.get_mut(conn) else {
                return;
            };
            if c.payload_pieces() >= cap || c.input() != Input::Payload(id) {
                return;
            }
            c.payload_piece_started();
            let req = &mut self.slots[id];
            req.piece_started();
            self.slots.set_piece(id, k, PieceState::Pacing);
            self.enqueue(IoToken::piece(id, k), IoKind::Write);
        }
    }

    /// The pacer released piece `k`: it takes its buffer, or queues for it.
    /// True as `piece_granted`.
    pub fn piece_released(&mut self, id: ReqId, k: u32) -> bool {
        self.slots.set_piece(id, k, PieceState::NeedBuffer);
        let len = self.slots[id].piece_len(k, self.io.buf_size());
        match self
            .io
            .bufs_mut()
            .alloc(len, IoToken::piece(id, k).encode())
        {
            Alloc::Ready(bufs) => {
                debug_assert_eq!(bufs.len(), 1, "a piece takes one buffer");
                self.piece_granted(id, k, bufs[0])
            }
            Alloc::Queued => {
                self.io.stats_mut().buffer_waits += 1;
                false
            }
        }
    }

    /// Piece `k` holds its buffer: a WRITE piece's bytes may arrive, a
    /// streamed READ's piece goes to the device. True: that stream now
    /// holds every buffer it will take, and the READs waiting behind it
    /// on its connection may start (`Requests::start_deferred`).
    pub fn piece_granted(&mut self, id: ReqId, k: u32, buf: BufId) -> bool {
        if self.slots[id].streamed() {
            self.read_piece_granted(id, k, buf);
            let req = &self.slots[id];
            let c = self.conns.get_mut(req.conn()).filter(|_| all_buffered(req));
            return c.map(|c| c.turns_mut().buffered(id)).is_some();
        }
        self.slots.set_piece(id, k, PieceState::Filling);
        let len = self.slots[id].piece_len(k, self.io.buf_size());
        let req = &mut self.slots[id];
        req.piece_buffer(k, buf, self.io.pool().ptr(buf), len);
        let conn = req.conn();
        if let Some(c) = self.conns.get_mut(conn) {
            // The stall clock runs only while the client's bytes can land.
            c.active(self.io.now());
        }
        self.io.touch(conn);
        false
    }

    /// `n` payload bytes landed in `id`'s filling piece (`filled` counts
    /// them already): a full piece goes to the device, and a full payload
    /// returns the connection to headers.
    pub fn payload_received(&mut self, id: ReqId, n: usize) {
        let bs = self.io.buf_size();
        let req = &self.slots[id];
        debug_assert!(n > 0 && req.filled() <= req.len());
        // The bytes all went into one piece: fills never cross a piece's end.
        let k = (req.filled() - 1) / bs;
        if req.filled() == k * bs + req.piece_len(k, bs) {
            self.submit_piece(id, k);
        }
        let req = &self.slots[id];
        if req.filled() == req.len() {
            let conn = req.conn();
            if let Some(c) = self.conns.get_mut(conn) {
                debug_assert_eq!(c.input(), Input::Payload(id));
                c.set_input(Input::Headers);
            }
        }
    }

    fn submit_piece(&mut self, id: ReqId, k: u32) {
        self.slots.set_piece(id, k, PieceState::Device);
        // Its payload is in: it no longer waits on the client, so its place
        // under the payload cap frees for the next piece (the pacer's
        // windows bound what is at the device). Held until written, the cap
        // kept one connection's writes to 4 at the device: 128 KiB writes at
        // QD 32 to this machine's disk ran at 0.37 MiB in flight under none.
        self.release_payload_slot(self.slots[id].conn());
        let req = &mut self.slots[id];
        req.piece_mut(k).t_submit = self.io.now();
        let now = self.io.now();
        (self.io.pacer_mut()).on_device_start(IoToken::piece(id, k).encode(), now);
        let request = req.io_request(
            bdev::IoOp::Write { fua: req.fua() },
            Some(k),
            self.io.buf_size(),
        );
        let export = req.export();
        self.io.submit(IoToken::piece(id, k), export, request);
    }

    /// The device wrote piece `k`; an emulated delay may hold it back.
    pub fn piece_written(&mut self, id: ReqId, k: u32) -> Then {
        let op = bdev::IoOp::Write {
            fua: self.slots[id].fua(),
        };
        if !self.delay_piece(id, k, op) {
            return self.piece_done(id, k);
        }
        Then::Done
    }

    /// Holds piece `k`'s completion back for its device's emulated delay,
    /// if it has one still to run: true when it did.
    pub fn delay_piece(&mut self, id: ReqId, k: u32, op: bdev::IoOp) -> bool {
        let req = &self.slots[id];
        let t_submit = req.pieces()[k as usize].t_submit;
        let Some(release) = self.io.delay_until(req.export(), op, t_submit) else {
            return false;
        };
        self.slots.set_piece(id, k, PieceState::Delayed);
        let token = IoToken::piece(id, k);
        self.io.hold(release, token);
        true
    }

    /// Piece `k` is written: its buffer and its place under the cap free.
    pub fn piece_done(&mut self, id: ReqId, k: u32) -> Then {
        let token = IoToken::piece(id, k);
        self.io.device_finished(&self.slots[id], token);
        let now = self.io.now();
        self.io.pacer_mut().on_complete(token.encode(), now);
        self.drop_piece(id, k);
        self.write_progress(id)
    }

    /// Piece `k` ends (written, sent or abandoned): returns its buffer. A
    /// streamed READ's piece leaves the pacer here: sent, or abandoned.
    pub fn drop_piece(&mut self, id: ReqId, k: u32) {
        let awaited_payload = matches!(
            self.slots[id].pieces()[k as usize].state,
            PieceState::Pacing | PieceState::NeedBuffer | PieceState::Filling
        );
        self.slots.set_piece(id, k, PieceState::Done);
        let req = &mut self.slots[id];
        if let Some(buf) = req.piece_mut(k).buf.take() {
            self.io.bufs_mut().free(&[buf]);
        }
        req.piece_ended();
        let conn = req.conn();
        self.io.touch(conn);
        if req.streamed() {
            // A READ's window is its own, not the connection's.
            let token = IoToken::piece(id, k).encode();
            if req.state() == ReqStage::Dropping {
                self.io.pacer_mut().cancel(token);
            } else {
                let now = self.io.now();
                self.io.pacer_mut().on_complete(token, now);
            }
            return;
        }
        if awaited_payload {
            self.release_payload_slot(conn);
        }
    }

    /// A WRITE piece of `conn` no longer waits for its payload.
    fn release_payload_slot(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.payload_piece_done();
        }
        self.io.touch(conn);
    }

    /// A WRITE whose pieces are all written is answered; one whose payload
    /// will never arrive is released once its pieces are off the device.
    pub fn write_progress(&mut self, id: ReqId) -> Then {
        let req = &self.slots[id];
        if req.state() != ReqStage::Payload || req.pieces_live() > 0 {
            return Then::Done;
        }
        if req.filled() == req.len() {
            self.set_state(id, ReqStage::Answered);
            return Then::Advance(id);
        }
        let receiving = self
            .conns
            .get(req.conn())
            .is_some_and(|c| c.life() == Life::Open && c.input() == Input::Payload(id));
        if !receiving {
            return Then::Release(id);
        }
        Then::Done
    }

    /// The connection will not deliver the rest of `id`'s payload: pieces
    /// not at the device end now; the rest end as the device finishes.
    pub fn abort_pieces(&mut self, id: ReqId) -> Then {
        let conn = self.slots[id].conn();
        // A recv in flight writes into the filling piece: it keeps its
        // buffer until that recv completes (recv_done aborts again).
        let receiving = self
            .conns
            .get(conn)
            .is_some_and(|c| c.recv() == RecvOp::Direct(id));
        let filling = self.slots[id].filling_piece(self.io.buf_size());
        for k in 0..self.slots[id].started() {
            if receiving && k == filling {
                continue;
            }
            let token = IoToken::piece(id, k);
            match self.slots[id].pieces()[k as usize].state {
                PieceState::Pacing | PieceState::Filling => {
                    self.io.pacer_mut().cancel(token.encode());
                }
                PieceState::NeedBuffer => {
                    self.io.pacer_mut().cancel(token.encode());
                    self.io.bufs_mut().cancel(token.encode());
                }
                _ => continue,
            }
            self.drop_piece(id, k);
        }
        self.write_progress(id)
    }

    /// Starts the next pieces of streamed READ `id` while it holds fewer
    /// than its window.
    pub fn start_stream_pieces(&mut self, id: ReqId) {
        let window = self.io.stream_window();
        loop {
            let req = &self.slots[id];
            let k = req.started();
            let serving = matches!(req.state(), ReqStage::Streaming | ReqStage::Reply);
            if !serving || k >= req.stream_end() || req.pieces_live() >= window {
                return;
            }
            if self
                .conns
                .get(req.conn())
                .is_none_or(|c| c.life() != Life::Open)
            {
                return;
            }
            let req = &mut self.slots[id];
            req.piece_started();
            self.slots.set_piece(id, k, PieceState::Pacing);
            self.enqueue(IoToken::piece(id, k), IoKind::Read);
        }
    }

    /// Piece `k` of a streamed READ holds its buffer: to the device.
    fn read_piece_granted(&mut self, id: ReqId, k: u32, buf: BufId) {
        self.slots.set_piece(id, k, PieceState::Device);
        let len = self.slots[id].piece_len(k, self.io.buf_size());
        let req = &mut self.slots[id];
        req.piece_buffer(k, buf, self.io.pool().ptr(buf), len);
        req.piece_mut(k).t_submit = self.io.now();
        let request = req.io_request(bdev::IoOp::Read, Some(k), self.io.buf_size());
        let export = req.export();
        self.io.submit(IoToken::piece(id, k), export, request);
    }

    /// The device read piece `k`; an emulated delay may hold it back.
    pub fn read_piece_done(&mut self, id: ReqId, k: u32) -> Then {
        if !self.delay_piece(id, k, bdev::IoOp::Read) {
            return self.read_piece_ready(id, k);
        }
        Then::Done
    }

    /// Piece `k`'s data is in its buffer (or the device failed it): the
    /// first piece puts the reply in the send queue, later ones extend it.
    pub fn read_piece_ready(&mut self, id: ReqId, k: u32) -> Then {
        self.io
            .device_finished(&self.slots[id], IoToken::piece(id, k));
        let req = &self.slots[id];
        let (conn, state, failed) = (req.conn(), req.state(), req.error() != 0);
        if state == ReqStage::Dropping {
            self.drop_piece(id, k);
            return self.release_dropped(id);
        }
        self.slots.set_piece(id, k, PieceState::Ready);
        let req = &mut self.slots[id];
        if req.chunked() {
            req.encode_piece_chunk(k, self.io.buf_size());
            if req.pieces()[k as usize].error != 0 {
                req.end_stream_at(k);
            }
        } else if failed && !req.pad_failed_piece(k) {
            if let Some(c) = self.conns.get_mut(conn) {
                c.ending(EndReason::StreamFailed);
            }
            return Then::Close(conn);
        }
        if state == ReqStage::Streaming && k == 0 {
            self.set_state(id, ReqStage::Answered);
            return Then::Advance(id);
        } else if state == ReqStage::Reply {
            self.conns.mark_send(conn);
        }
        Then::Done
    }

    /// `sent` bytes of streamed READ `id`'s reply have left: pieces wholly
    /// sent free their buffers, and the next pieces start.
    pub fn stream_sent(&mut self, id: ReqId, sent: usize) {
        loop {
            let req = &self.slots[id];
            let k = req.sent_pieces();
            // A piece not yet read has not been sent, whatever its end says
            // (a failed piece still in its emulated delay has an error but
            // no error chunk yet, so its end is the end of the one before).
            let ready = req.pieces().get(k as usize).map(|p| p.state) == Some(PieceState::Ready);
            if k >= req.stream_end() || !ready || req.piece_end(k, self.io.buf_size()) > sent {
                break;
            }
            self.drop_piece(id, k);
            self.slots[id].piece_sent();
        }
        self.start_stream_pieces(id);
    }

    /// The connection closed under streamed READ `id` (no send in flight
    /// covers it): pieces not at the device end now, the rest as they come
    /// back; then the slot frees.
    pub fn abandon_stream(&mut self, id: ReqId) -> Then {
        self.set_state(id, ReqStage::Dropping);
        let req = &self.slots[id];
        for k in req.sent_pieces()..req.started() {
            let token = IoToken::piece(id, k).encode();
            match self.slots[id].pieces()[k as usize].state {
                PieceState::Ready => {}
                PieceState::Pacing => {
                    self.io.pacer_mut().cancel(token);
                }
                PieceState::NeedBuffer => {
                    self.io.pacer_mut().cancel(token);
                    self.io.bufs_mut().cancel(token);
                }
                _ => continue,
            }
            self.drop_piece(id, k);
        }
        self.release_dropped(id)
    }

    /// A dropping READ frees its slot once no piece is at the device.
    fn release_dropped(&self, id: ReqId) -> Then {
        if self.slots[id].pieces_live() == 0 {
            return Then::Release(id);
        }
        Then::Done
    }

    /// New READ `id` (paced whole, or planned as a stream): starts now if
    /// its turn has come, else waits for it.
    pub fn read_turn(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.slots[id].streamed();
        let conn = self.slots[id].conn();
        let Some(c) = self.conns.get_mut(conn) else {
            return self.start_read(id);
        };
        if c.turns().may_start(streamed) {
            return self.start_read(id);
        }
        c.turns_mut().wait(id);
        ReqStage::Deferred
    }

    /// READ `id`'s turn has come: a stream claims its connection, a whole
    /// READ goes to the pacer.
    pub fn start_read(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.slots[id].streamed();
        let conn = self.slots[id].conn();
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns_mut().start(id, streamed);
        }
        if streamed {
            return ReqStage::Streaming;
        }
        self.enqueue(IoToken::whole(id), IoKind::Read);
        ReqStage::Pacing
    }

    /// New: a READ goes to the pacer (a large one piece by piece) when its
    /// turn around streams has come, a WRITE takes its payload piece by
    /// piece, other commands go to the device.
    pub fn start(&mut self, id: ReqId) -> Option<ReqStage> {
        let buf_size = self.io.buf_size();
        let req = &self.slots[id];
        // An NVMe/TCP command is at most MDTS, which the pool holds at once.
        let nvme = req.style() == ReplyStyle::Nvme;
        let streams = !nvme && self.io.streams(req.len());
        let req = &mut self.slots[id];
        let conn = req.conn();
        match req.command() {
            Command::Write if nvme && req.len() > 0 => {
                // Paced whole, as a READ: its R2T goes once its buffers are in.
                req.set_paced();
                self.slots.commit(id, self.conns, self.io);
                self.enqueue(IoToken::whole(id), IoKind::Write);
                Some(ReqStage::Pacing)
            }
            Command::Read if req.len() > 0 => {
                if streams {
                    req.plan_pieces(buf_size);
                } else {
                    req.set_paced();
                }
                self.slots.commit(id, self.conns, self.io);
                Some(self.read_turn(id))
            }
            Command::Write if req.len() > 0 => {
                req.plan_pieces(buf_size);
                self.slots.commit(id, self.conns, self.io);
                if let Some(c) = self.conns.get_mut(conn) {
                    c.set_input(Input::Payload(id));
                }
                // Settling the connection starts the first pieces.
                self.io.touch(conn);
                Some(ReqStage::Payload)
            }
            // A zero-length WRITE has nothing to do but answer.
            Command::Write => Some(ReqStage::Answered),
            _ => Some(ReqStage::Ready),
        }
    }

    /// Released: a READ takes its buffers, or queues for them.
    pub fn take_buffers(&mut self, id: ReqId) -> Option<ReqStage> {
        if self.slots.take_buffers(id, self.io) {
            Some(self.holds_buffers(id))
        } else {
            Some(ReqStage::NeedBuffers)
        }
    }

    /// A whole request took its buffers: to the device, or (an NVMe
    /// WRITE) its data comes first.
    pub fn holds_buffers(&mut self, id: ReqId) -> ReqStage {
        let req = &self.slots[id];
        if req.style() == ReplyStyle::Nvme && req.command() == Command::Write {
            nvme_data::data_wanted(id, self.conns, self.slots, self.io)
        } else {
            ReqStage::Ready
        }
    }
}
