//! The request machine: [`Requests`], the request slots' lives over the
//! parts they move (the slots, the connections, the IO path). Events (the
//! pacer releases an IO, buffers arrive, the device finishes, a delay
//! expires, a reply is sent, bytes or an end come in, a connection closes)
//! move a request into a transient state and call [`Requests::advance`],
//! which takes it as far as it can go and stops in a waiting state (the
//! diagram is `states.rs`'s). Every change goes through
//! [`Requests::set_state`] (`Slots::set_state`), which asserts it is an
//! arrow of the diagram. A streamed READ's pieces go on while it waits in
//! `Reply` (`pieces.rs`); what a piece operation leaves to the machine
//! comes back as a `Then`, carried out here. The engine (`mod.rs`) makes a
//! `Requests` over its parts for each event; so do the front ends.

use bdev::IoResult;
use proto::Command;

use super::conn::Conn;
use super::conn_state::{EndReason, Input, Life, RecvOp, SendOp};
use super::conns::Conns;
use super::events::{Action, Received, Sent};
use super::framing::ReplyStyle;
use super::ids::{ConnId, IoToken, Part, ReqId};
use super::io_path::IoPath;
use super::nvme_data;
use super::pieces::{Pieces, Then};
use super::slots::Slots;
use super::states::ReqStage;

/// The request machine over the engine's parts (it owns no state).
pub struct Requests<'e> {
    slots: &'e mut Slots,
    conns: &'e mut Conns,
    io: &'e mut IoPath,
    /// Scratch list of requests whose replies a send finished (the
    /// engine's, kept for its capacity).
    sent: &'e mut Vec<ReqId>,
}

impl<'e> Requests<'e> {
    pub fn new(
        slots: &'e mut Slots,
        conns: &'e mut Conns,
        io: &'e mut IoPath,
        sent: &'e mut Vec<ReqId>,
    ) -> Requests<'e> {
        Requests {
            slots,
            conns,
            io,
            sent,
        }
    }

    /// The parts the front ends (`nbd.rs`, `nvme.rs`) read a connection's
    /// input into and start its requests on, beside the machine: the
    /// slots, the connections and the IO path.
    pub(super) fn parts(&mut self) -> (&mut Slots, &mut Conns, &mut IoPath) {
        (self.slots, self.conns, self.io)
    }

    /// Connection `id`, if it is still there.
    pub(super) fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns.get_mut(id)
    }

    pub(super) fn set_state(&mut self, id: ReqId, to: ReqStage) {
        let now = self.io.now();
        (self.slots).set_state(id, to, self.io.stats_mut(), now);
    }

    /// Every request transition: moves `id` until it waits for something.
    pub(super) fn advance(&mut self, id: ReqId) {
        loop {
            let next = match self.slots[id].state() {
                ReqStage::New => self.piece_ops().start(id),
                ReqStage::Released => self.piece_ops().take_buffers(id),
                ReqStage::Ready => (self.slots).execute(id, self.conns, self.io),
                ReqStage::Executed => (self.slots).executed(id, self.conns, self.io),
                ReqStage::Answered => self.answered(id),
                ReqStage::Sent => {
                    self.finish(id);
                    return;
                }
                ReqStage::Streaming => {
                    self.piece_ops().start_stream_pieces(id);
                    return;
                }
                // Waiting: for the pacer, the pool, the device, a timer,
                // payload pieces, or the send queue.
                ReqStage::Deferred
                | ReqStage::Pacing
                | ReqStage::NeedBuffers
                | ReqStage::Device
                | ReqStage::Delayed
                | ReqStage::Payload
                | ReqStage::Receiving
                | ReqStage::Reply
                | ReqStage::Dropping
                | ReqStage::Free => return,
            };
            match next {
                Some(state) => self.set_state(id, state),
                None => return,
            }
        }
    }

    /// Runs a piece operation (`pieces.rs`), then what it leaves to the
    /// request machine.
    fn pieces(&mut self, f: impl FnOnce(&mut Pieces) -> Then) {
        match f(&mut self.piece_ops()) {
            Then::Done => {}
            Then::Advance(id) => self.advance(id),
            Then::Release(id) => self.release(id),
            Then::Close(conn) => self.close(conn),
        }
    }

    /// The piece machinery, over the engine's slots, connections and IO path.
    pub(super) fn piece_ops(&mut self) -> Pieces<'_> {
        Pieces::new(self.slots, self.conns, self.io)
    }

    /// Answered: queue the reply, or drop it if the client is gone.
    fn answered(&mut self, id: ReqId) -> Option<ReqStage> {
        let conn = self.slots[id].conn();
        match self.conns.get_mut(conn) {
            Some(c) if c.life() == Life::Open => {
                let req = &self.slots[id];
                let paced = req.paced() && req.command() == Command::Read;
                let nvme = req.style() == ReplyStyle::Nvme;
                debug_assert!(
                    !(paced && c.turns().stream().is_some()),
                    "request {id:?}: a READ's data queued beside a stream still taking buffers"
                );
                c.out_mut().push(id, req.streamed());
                if nvme {
                    nvme_data::reply(id, self.conns, self.slots);
                } else {
                    self.slots[id].encode_reply();
                }
                self.conns.mark_send(conn);
                if paced {
                    self.read_queued(conn);
                }
                Some(ReqStage::Reply)
            }
            _ if self.slots[id].streamed() => {
                self.pieces(|p| p.abandon_stream(id));
                None
            }
            _ => {
                self.release(id);
                None
            }
        }
    }

    /// Sent: count it, tell the pacer its data has left, free the slot.
    fn finish(&mut self, id: ReqId) {
        let req = &self.slots[id];
        let now = self.io.now();
        self.io.stats_mut().record_done(&req.served(), now);
        if let Some(c) = self.conns.get_mut(req.conn()) {
            c.replied();
        }
        if req.paced() {
            let now = self.io.now();
            (self.io.pacer_mut()).on_complete(IoToken::whole(id).encode(), now);
        }
        self.release(id);
    }

    /// Frees the request's buffers and slot: the end of its life. A paced
    /// READ that did not reach `finish` leaves the pacer here.
    fn release(&mut self, id: ReqId) {
        let req = &self.slots[id];
        debug_assert!(req.pieces().iter().all(|p| p.buf.is_none()));
        if req.paced() && !matches!(req.state(), ReqStage::Sent | ReqStage::Deferred) {
            self.io.pacer_mut().cancel(IoToken::whole(id).encode());
        }
        let (conn, need) = (req.conn(), self.io.commitment(&self.slots[id]));
        let pending = self.slots[id].read_pending();
        let req = &mut self.slots[id];
        if !req.bufs().is_empty() {
            self.io.bufs_mut().free(req.bufs());
            req.clear_bufs();
        }
        self.set_state(id, ReqStage::Free);
        self.io.stats_mut().leave(ReqStage::Free.stat());
        self.slots.free(id);
        if let Some(c) = self.conns.get_mut(conn) {
            c.request_ended(need, self.io.now());
        }
        if pending {
            self.read_ended(conn, id);
        }
        self.io.touch(conn);
        if let Some(waiter) = self.slots.next_waiter() {
            // An NBD connection parses its next header; an NVMe/TCP one
            // starts its next waiting command.
            match self.conns.get_mut(waiter) {
                Some(c) if c.input() == Input::WaitSlot => {
                    c.set_input(Input::Headers);
                }
                _ => {}
            }
            self.io.touch(waiter);
        }
    }

    /// The connection is closing: take `id` out of whatever queue it waits
    /// in. One at the device finishes first; its completion releases it.
    pub(super) fn abort(&mut self, id: ReqId) {
        let token = IoToken::whole(id).encode();
        match self.slots[id].state() {
            ReqStage::Pacing => {
                self.io.pacer_mut().cancel(token);
                self.release(id);
            }
            ReqStage::NeedBuffers => {
                self.io.bufs_mut().cancel(token);
                self.release(id);
            }
            ReqStage::Deferred => {
                let conn = self.slots[id].conn();
                if let Some(c) = self.conns.get_mut(conn) {
                    c.turns_mut().forget(id);
                }
                self.release(id);
            }
            ReqStage::Payload => self.pieces(|p| p.abort_pieces(id)),
            ReqStage::Receiving => {
                // Its data may be landing in its buffers (`RecvOp::H2c`):
                // they go once that recv is back (`h2c_received`).
                let conn = self.slots[id].conn();
                let landing = RecvOp::H2c(id);
                if self.conns.get(conn).is_none_or(|c| c.recv() != landing) {
                    self.release(id);
                }
            }
            ReqStage::Streaming => self.pieces(|p| p.abandon_stream(id)),
            // At the device or delayed: released when done. Replies: their
            // connection's send queue releases them. Dropping: when its
            // pieces are back.
            _ => {}
        }
    }

    // Connections' ends: closed, input ended, bytes received.

    /// Shuts the socket down and releases everything not in the kernel's or
    /// the device's hands; the rest is released as it completes.
    pub(super) fn close(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.life() == Life::Closing {
            return;
        }
        let (input, sending) = c.close();
        self.io.act(Action::Shutdown {
            conn: id,
            read_only: false,
        });
        if input == Input::WaitSlot {
            self.slots.forget_waiter(id);
        }
        if !sending {
            self.drop_replies(id);
        }
        for i in 0..self.slots.total() {
            let req = &self.slots[ReqId(i)];
            if req.conn() == id && req.state() != ReqStage::Free {
                self.abort(ReqId(i));
            }
        }
        nvme_data::closed(id, self.conns, self.slots, self.io);
        self.io.touch(id);
    }

    /// No more input from this connection: serve what is in flight, then close.
    pub(super) fn input_ended(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let was = c.set_input(Input::Ended);
        match was {
            // A WRITE whose payload will never arrive: nothing to execute.
            Input::Payload(r) => self.pieces(|p| p.abort_pieces(r)),
            Input::WaitSlot => self.slots.forget_waiter(id),
            // NVMe/TCP: WRITEs waiting for their data never get it.
            Input::Pdus => {
                for r in nvme_data::requests_of(id, self.conns) {
                    if self.slots[r].state() == ReqStage::Receiving {
                        self.abort(r);
                    }
                }
            }
            _ => {}
        }
        self.io.touch(id);
    }

    /// `conn`'s posted recv finished: bytes into its receive buffer or a
    /// WRITE piece, its end, or an error.
    pub(super) fn received(&mut self, id: ConnId, result: Received) {
        let now = self.io.now();
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let op = c.set_recv(RecvOp::Idle);
        self.io.touch(id);
        if let Received::Data(n) = result {
            self.io.stats_mut().bytes_in += n as u64;
            c.bytes_in(n);
            if matches!(op, RecvOp::Direct(_) | RecvOp::H2c(_)) {
                self.io.stats_mut().bytes_in_direct += n as u64;
            }
        }
        if c.life() == Life::Closing {
            match op {
                // Its piece's buffer was kept for this recv; now it may go.
                RecvOp::Direct(r) => self.pieces(|p| p.abort_pieces(r)),
                RecvOp::H2c(r) => self.h2c_received(id, r, 0),
                _ => {}
            }
            return;
        }
        match result {
            Received::Error(errno) => {
                let e = std::io::Error::from_raw_os_error(errno);
                tracing::debug!(reactor = self.io.reactor(), conn = id.index, "recv: {e}");
                c.ending(EndReason::RecvError);
                self.close(id);
                if let RecvOp::H2c(r) = op {
                    self.h2c_received(id, r, 0);
                }
            }
            Received::Eof | Received::Data(0) => {
                c.ending(EndReason::ClientClosed);
                self.input_ended(id);
                if let RecvOp::H2c(r) = op {
                    self.h2c_received(id, r, 0);
                }
            }
            Received::Data(n) => {
                c.active(now);
                match op {
                    RecvOp::Direct(r) => {
                        self.slots[r].payload_in(n as u32);
                        self.piece_ops().payload_received(r, n);
                    }
                    RecvOp::H2c(r) => self.h2c_received(id, r, n),
                    _ => {
                        c.landed(n);
                    }
                }
            }
        }
    }

    /// A recv straight into NVMe/TCP WRITE `r`'s buffers (`RecvOp::H2c`) is
    /// back with `n` bytes of its data: the queue and the request count
    /// them. A WRITE whose connection no longer reads PDUs (closed, or its
    /// input ended while the recv was out) gets no more: its buffers,
    /// kept for that recv, go now.
    fn h2c_received(&mut self, id: ConnId, r: ReqId, n: usize) {
        if n > 0 {
            nvme_data::landed(id, r, n, self.conns, self.slots);
        }
        let reading = (self.conns.get(id))
            .is_some_and(|c| c.life() == Life::Open && c.input() == Input::Pdus);
        if !reading && self.slots[r].state() == ReqStage::Receiving {
            self.abort(r);
        }
    }

    // Events of the pacer, the pool and the devices.

    /// The pacer releases IOs it holds. The engine asks after every
    /// round of settling, mostly with nothing queued: that check is inline.
    #[inline]
    pub(super) fn poll_pacer(&mut self) -> bool {
        self.io.pacer().queued() != 0 && self.release_paced()
    }

    /// `poll_pacer` with IOs queued: those the pacer releases now go on.
    #[inline(never)]
    fn release_paced(&mut self) -> bool {
        let released = self.io.pacer_releases();
        for &v in &released {
            let io = IoToken::decode(v);
            match io.part {
                Part::Whole => {
                    self.set_state(io.req, ReqStage::Released);
                    self.advance(io.req);
                }
                Part::Piece(k) => {
                    if self.piece_ops().piece_released(io.req, k) {
                        self.start_deferred(self.slots[io.req].conn());
                    }
                }
            }
        }
        let any = !released.is_empty();
        self.io.releases_done(released);
        any
    }

    /// Buffers granted to requests that queued for them.
    pub(super) fn poll_grants(&mut self) {
        let grants = self.io.buffer_grants();
        for (token, bufs) in grants {
            let io = IoToken::decode(token);
            match io.part {
                Part::Whole => {
                    debug_assert_eq!(self.slots[io.req].state(), ReqStage::NeedBuffers);
                    self.slots.attach(io.req, bufs, self.io);
                    let next = self.piece_ops().holds_buffers(io.req);
                    self.set_state(io.req, next);
                    self.advance(io.req);
                }
                Part::Piece(k) => {
                    debug_assert_eq!(bufs.len(), 1, "a piece takes one buffer");
                    if self.piece_ops().piece_granted(io.req, k, bufs[0]) {
                        self.start_deferred(self.slots[io.req].conn());
                    }
                }
            }
        }
    }

    /// The device finished `io` (as the bdev reads its completion).
    pub(super) fn io_done(&mut self, io: IoToken, result: IoResult) {
        // A write marks its blocks dirty again at completion, failed or not:
        // a bitmap cleared while it was at the device must not lose it.
        if let Some((export, r)) = self
            .slots
            .io_request(io, self.io.buf_size())
            .filter(|(_, r)| r.op.is_write())
        {
            self.io.mark_dirty(export, &r);
        }
        if let IoResult::Err(errno) = result {
            let req = &mut self.slots[io.req];
            let piece = match io.part {
                Part::Piece(k) => Some(k),
                Part::Whole => None,
            };
            req.io_failed(piece, errno);
        }
        match io.part {
            Part::Whole => {
                self.set_state(io.req, ReqStage::Executed);
                self.advance(io.req);
            }
            Part::Piece(k) if self.slots[io.req].streamed() => {
                self.pieces(|p| p.read_piece_done(io.req, k))
            }
            Part::Piece(k) => self.pieces(|p| p.piece_written(io.req, k)),
        }
    }

    /// Completions whose emulated delay (and fault stall) has passed.
    pub(super) fn fire_delayed(&mut self) {
        while let Some(io) = self.io.due_held() {
            let export = self.slots[io.req].export() as usize;
            if let Some(later) = self.io.catalog().exports[export]
                .bdev
                .still_stalled(self.io.now())
            {
                // A fault layer's stall still holds it.
                self.io.hold(later, io);
                continue;
            }
            match io.part {
                Part::Whole => {
                    (self.io).device_finished(&self.slots[io.req], io);
                    let next = self.slots.piece_finished(io.req, self.conns);
                    self.set_state(io.req, next);
                    self.advance(io.req);
                }
                Part::Piece(k) if self.slots[io.req].streamed() => {
                    self.pieces(|p| p.read_piece_ready(io.req, k))
                }
                Part::Piece(k) => self.pieces(|p| p.piece_done(io.req, k)),
            }
        }
    }

    // READ turns around streams (`turns.rs` holds each connection's `Turns`).

    /// Whole READ on `conn` queued its data to send.
    fn read_queued(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns_mut().queued();
        }
        self.start_deferred(conn);
    }

    /// READ `id` on `conn` ended before its data was queued, or it was a
    /// stream: the READs waiting for it may start.
    fn read_ended(&mut self, conn: ConnId, id: ReqId) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.turns_mut().ended(id);
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
            if c.life() != Life::Open {
                return;
            }
            let slots = &*self.slots;
            let Some(id) = c.turns_mut().next(|r| slots[r].streamed()) else {
                return;
            };
            let to = self.piece_ops().start_read(id);
            self.set_state(id, to);
            self.advance(id);
        }
    }

    // Replies: queued per connection in send order (`Outbox`), and sent in
    // batches, one sendmsg with many iovecs per connection per round.

    pub(super) fn send_done(&mut self, id: ConnId, result: Sent) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.send_done(result);
        self.io.touch(id);
        if let Sent::Bytes(n) = result {
            self.io.stats_mut().bytes_out += n as u64;
        }
        if c.life() == Life::Closing {
            // The replies the send covered may go now.
            c.out_mut().drop_raw_sending();
            self.drop_replies(id);
            return;
        }
        let sent = match result {
            Sent::Bytes(n) => n,
            Sent::Error(errno) => {
                let e = std::io::Error::from_raw_os_error(errno);
                tracing::debug!(reactor = self.io.reactor(), conn = id.index, "send: {e}");
                c.ending(EndReason::SendError);
                self.close(id);
                return;
            }
        };
        // A streamed READ partly sent: how far.
        let partial = (c.out_mut()).sent(sent, self.slots.reqs(), self.io.buf_size(), self.sent);
        let more = c.out().has_more();
        self.replies_left(partial);
        if more {
            self.conns.mark_send(id);
        }
    }

    /// The replies in `self.sent` have wholly left; a streamed READ's
    /// `partial` reply has left up to its byte count.
    fn replies_left(&mut self, partial: Option<(ReqId, usize)>) {
        let sent = std::mem::take(self.sent);
        for &r in &sent {
            if self.slots[r].streamed() {
                self.piece_ops().stream_sent(r, usize::MAX);
                if self.slots[r].pieces_live() > 0 {
                    // A chunked reply ended early by a failed piece: the
                    // pieces past it are dropped as they come back.
                    let now = self.io.now();
                    (self.io.stats_mut()).record_done(&self.slots[r].served(), now);
                    self.pieces(|p| p.abandon_stream(r));
                    continue;
                }
            }
            self.set_state(r, ReqStage::Sent);
            self.advance(r);
        }
        if let Some((r, bytes)) = partial.filter(|&(r, _)| self.slots[r].streamed()) {
            self.piece_ops().stream_sent(r, bytes);
        }
        *self.sent = sent;
        self.sent.clear();
    }

    /// Releases the replies queued on a closing connection: no send covers
    /// them any more.
    fn drop_replies(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        debug_assert_ne!(c.send(), SendOp::InFlight);
        c.out_mut().drain_replies(self.sent);
        let queued = std::mem::take(self.sent);
        for &r in &queued {
            if self.slots[r].streamed() {
                self.pieces(|p| p.abandon_stream(r));
            } else {
                self.release(r);
            }
        }
        *self.sent = queued;
        self.sent.clear();
    }
}
