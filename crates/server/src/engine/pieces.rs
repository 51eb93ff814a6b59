//! Pieces: a request's data one buffer-sized piece at a time, for WRITE
//! payloads and for READs too large for their buffers at once (streamed,
//! `stream.rs`). A piece goes through the pacer, takes one buffer and goes
//! to the device as its own IO. A WRITE piece receives its bytes before
//! that; the reply goes when every piece is written. A connection holds at
//! most `payload_cap` WRITE pieces waiting for their payload at once, so a
//! writer that stalls mid-payload holds at most that many buffers:
//!
//! ```text
//! WRITE: Idle ──► Pacing ──► NeedBuffer ──► Filling ──► Device ──► (Delayed) ──► Done
//! READ:  Idle ──► Pacing ──► NeedBuffer ──► Device ──► (Delayed) ──► Ready ──► Done
//! ```

use pace::pacer::IoKind;
use pool::{Alloc, BufId};

use super::conn::{Input, Life, RecvOp};
use super::ids::{ConnId, IoToken, ReqId};
use super::states::{PieceState, ReqStage};
use super::Engine;

impl Engine {
    /// Starts the next pieces of `id`'s payload while its connection has room.
    pub(super) fn start_pieces(&mut self, id: ReqId) {
        let conn = self.slots.reqs[id.index()].conn;
        loop {
            let req = &self.slots.reqs[id.index()];
            let k = req.started;
            if k as usize >= req.pieces.len() || req.state != ReqStage::Payload {
                return;
            }
            let cap = self.io.payload_cap;
            let Some(c) = self.conns.get_mut(conn) else {
                return;
            };
            if c.payload_pieces >= cap || c.input != Input::Payload(id) {
                return;
            }
            c.payload_pieces += 1;
            let req = &mut self.slots.reqs[id.index()];
            req.started += 1;
            req.pieces_live += 1;
            self.slots.set_piece(id, k, PieceState::Pacing);
            let io = self.paced_io(IoToken::piece(id, k), IoKind::Write);
            self.io.pacer.enqueue(io, self.io.now);
        }
    }

    /// The pacer released piece `k`: it takes its buffer, or queues for it.
    pub(super) fn piece_released(&mut self, id: ReqId, k: u32) {
        self.slots.set_piece(id, k, PieceState::NeedBuffer);
        let len = self.slots.reqs[id.index()].piece_len(k, self.io.buf_size);
        match self.io.bufs.alloc(len, IoToken::piece(id, k).encode()) {
            Alloc::Ready(bufs) => {
                debug_assert_eq!(bufs.len(), 1, "a piece takes one buffer");
                self.piece_granted(id, k, bufs[0]);
            }
            Alloc::Queued => self.io.stats.buffer_waits += 1,
        }
    }

    /// Piece `k` holds its buffer: a WRITE piece's bytes may arrive, a
    /// streamed READ's piece goes to the device.
    pub(super) fn piece_granted(&mut self, id: ReqId, k: u32, buf: BufId) {
        if self.slots.reqs[id.index()].streamed() {
            self.read_piece_granted(id, k, buf);
            return;
        }
        self.slots.set_piece(id, k, PieceState::Filling);
        let len = self.slots.reqs[id.index()].piece_len(k, self.io.buf_size);
        let req = &mut self.slots.reqs[id.index()];
        req.pieces[k as usize].buf = Some(buf);
        req.iov[k as usize] = libc::iovec {
            iov_base: self.io.pool.ptr(buf).cast(),
            iov_len: len as usize,
        };
        let conn = req.conn;
        if let Some(c) = self.conns.get_mut(conn) {
            // The stall clock runs only while the client's bytes can land.
            c.active_at = self.io.now;
        }
        self.io.touched.push(conn);
    }

    /// `n` payload bytes landed in `id`'s filling piece (`filled` counts
    /// them already): a full piece goes to the device, and a full payload
    /// returns the connection to headers.
    pub(super) fn payload_received(&mut self, id: ReqId, n: usize) {
        let bs = self.io.buf_size;
        let req = &self.slots.reqs[id.index()];
        debug_assert!(n > 0 && req.filled <= req.len);
        // The bytes all went into one piece: fills never cross a piece's end.
        let k = (req.filled - 1) / bs;
        if req.filled == k * bs + req.piece_len(k, bs) {
            self.submit_piece(id, k);
        }
        let req = &self.slots.reqs[id.index()];
        if req.filled == req.len {
            let conn = req.conn;
            if let Some(c) = self.conns.get_mut(conn) {
                debug_assert_eq!(c.input, Input::Payload(id));
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
        self.release_payload_slot(self.slots.reqs[id.index()].conn);
        let req = &mut self.slots.reqs[id.index()];
        req.pieces[k as usize].t_submit = self.io.now;
        self.io
            .pacer
            .on_device_start(IoToken::piece(id, k).encode(), self.io.now);
        let io = req.io_request(
            bdev::IoOp::Write { fua: req.fua() },
            Some(k),
            self.io.buf_size,
        );
        let export = req.export;
        self.io.submit(IoToken::piece(id, k), export, io);
    }

    /// The device wrote piece `k`; an emulated delay may hold it back.
    pub(super) fn piece_written(&mut self, id: ReqId, k: u32) {
        let op = bdev::IoOp::Write {
            fua: self.slots.reqs[id.index()].fua(),
        };
        if !self.delay_piece(id, k, op) {
            self.piece_done(id, k);
        }
    }

    /// Holds piece `k`'s completion back for its device's emulated delay,
    /// if it has one still to run: true when it did.
    pub(super) fn delay_piece(&mut self, id: ReqId, k: u32, op: bdev::IoOp) -> bool {
        let req = &self.slots.reqs[id.index()];
        let dev = &self.io.catalog.exports[req.export as usize].bdev;
        if !dev.has_delay() {
            return false;
        }
        let t_submit = req.pieces[k as usize].t_submit;
        let release = dev.release_at(op, t_submit, self.io.now, &mut self.io.rng);
        if release <= self.io.now {
            return false;
        }
        self.slots.set_piece(id, k, PieceState::Delayed);
        let token = IoToken::piece(id, k);
        self.io.delayed.push(std::cmp::Reverse((release, token)));
        true
    }

    /// Piece `k` is written: its buffer and its place under the cap free.
    pub(super) fn piece_done(&mut self, id: ReqId, k: u32) {
        let token = IoToken::piece(id, k);
        self.device_finished(token);
        self.io.pacer.on_complete(token.encode(), self.io.now);
        self.drop_piece(id, k);
        self.write_progress(id);
    }

    /// Piece `k` ends (written, sent or abandoned): returns its buffer. A
    /// streamed READ's piece leaves the pacer here: sent, or abandoned.
    pub(super) fn drop_piece(&mut self, id: ReqId, k: u32) {
        let awaited_payload = matches!(
            self.slots.reqs[id.index()].pieces[k as usize].state,
            PieceState::Pacing | PieceState::NeedBuffer | PieceState::Filling
        );
        self.slots.set_piece(id, k, PieceState::Done);
        let req = &mut self.slots.reqs[id.index()];
        if let Some(buf) = req.pieces[k as usize].buf.take() {
            self.io.bufs.free(&[buf]);
        }
        debug_assert!(req.pieces_live > 0);
        req.pieces_live -= 1;
        let conn = req.conn;
        self.io.touched.push(conn);
        if req.streamed() {
            // A READ's window is its own, not the connection's.
            let token = IoToken::piece(id, k).encode();
            if req.state == ReqStage::Dropping {
                self.io.pacer.cancel(token);
            } else {
                self.io.pacer.on_complete(token, self.io.now);
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
            debug_assert!(
                c.payload_pieces > 0,
                "{conn:?} frees a payload slot it never took"
            );
            c.payload_pieces -= 1;
        }
        self.io.touched.push(conn);
    }

    /// A WRITE whose pieces are all written is answered; one whose payload
    /// will never arrive is released once its pieces are off the device.
    pub(super) fn write_progress(&mut self, id: ReqId) {
        let req = &self.slots.reqs[id.index()];
        if req.state != ReqStage::Payload || req.pieces_live > 0 {
            return;
        }
        if req.filled == req.len {
            self.set_state(id, ReqStage::Answered);
            self.advance(id);
            return;
        }
        let receiving = self
            .conns
            .get(req.conn)
            .is_some_and(|c| c.life == Life::Open && c.input == Input::Payload(id));
        if !receiving {
            self.release(id);
        }
    }

    /// The connection will not deliver the rest of `id`'s payload: pieces
    /// not at the device end now; the rest end as the device finishes.
    pub(super) fn abort_pieces(&mut self, id: ReqId) {
        let conn = self.slots.reqs[id.index()].conn;
        // A recv in flight writes into the filling piece: it keeps its
        // buffer until that recv completes (recv_done aborts again).
        let receiving = self
            .conns
            .get(conn)
            .is_some_and(|c| c.recv == RecvOp::Direct(id));
        let filling = self.slots.reqs[id.index()].filling_piece(self.io.buf_size);
        for k in 0..self.slots.reqs[id.index()].started {
            if receiving && k == filling {
                continue;
            }
            let token = IoToken::piece(id, k);
            match self.slots.reqs[id.index()].pieces[k as usize].state {
                PieceState::Pacing | PieceState::Filling => {
                    self.io.pacer.cancel(token.encode());
                }
                PieceState::NeedBuffer => {
                    self.io.pacer.cancel(token.encode());
                    self.io.bufs.cancel(token.encode());
                }
                _ => continue,
            }
            self.drop_piece(id, k);
        }
        self.write_progress(id);
    }
}
