//! Replies: queued per connection in send order, and sent in batches, one
//! sendmsg with many iovecs per connection per round.

use super::conn::{EndReason, Life, SendOp};
use super::ids::{ConnId, ReqId};
use super::states::ReqStage;
use super::{Action, Engine, Sent};

impl Engine {
    /// Posts one sendmsg with the handshake bytes, or with every queued
    /// reply that fits.
    pub(super) fn start_send(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.send != SendOp::Ready {
            return;
        }
        if c.life != Life::Open {
            c.set_send(SendOp::Idle);
            return;
        }
        match c.out.next_msg(&self.slots.reqs, self.io.buf_size) {
            Some(msg) => {
                c.set_send(SendOp::InFlight);
                self.io.actions.push(Action::Send { conn: id, msg });
            }
            None => {
                c.set_send(SendOp::Idle);
                self.io.touched.push(id);
            }
        }
    }

    pub(super) fn send_done(&mut self, id: ConnId, result: Sent) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        debug_assert_eq!(
            c.send,
            SendOp::InFlight,
            "{id:?}: a send completed never posted"
        );
        c.set_send(SendOp::Idle);
        self.io.touched.push(id);
        if let Sent::Bytes(n) = result {
            self.io.stats.bytes_out += n as u64;
            c.traffic.bytes_out += n as u64;
        }
        if c.life == Life::Closing {
            // The replies the send covered may go now.
            c.out.raw_sending.clear();
            self.drop_replies(id);
            return;
        }
        let sent = match result {
            Sent::Bytes(n) => n,
            Sent::Error(errno) => {
                let e = std::io::Error::from_raw_os_error(errno);
                tracing::debug!(reactor = self.id, conn = id.index, "send: {e}");
                c.ending(EndReason::SendError);
                self.close(id);
                return;
            }
        };
        // A streamed READ partly sent: how far.
        let partial = (c.out).sent(sent, &self.slots.reqs, self.io.buf_size, &mut self.sent);
        let more = c.out.has_more();
        self.replies_left(partial);
        if more {
            self.conns.mark_send(id);
        }
    }

    /// The replies in `self.sent` have wholly left; a streamed READ's
    /// `partial` reply has left up to its byte count.
    fn replies_left(&mut self, partial: Option<(ReqId, usize)>) {
        let sent = std::mem::take(&mut self.sent);
        for &r in &sent {
            if self.slots.reqs[r.index()].streamed() {
                (self.slots).stream_sent(r, usize::MAX, &mut self.conns, &mut self.io);
                if self.slots.reqs[r.index()].pieces_live > 0 {
                    // A chunked reply ended early by a failed piece: the
                    // pieces past it are dropped as they come back.
                    self.io
                        .stats
                        .record_done(&self.slots.reqs[r.index()].served(), self.io.now);
                    self.pieces(|s, c, p| s.abandon_stream(r, c, p));
                    continue;
                }
            }
            self.set_state(r, ReqStage::Sent);
            self.advance(r);
        }
        if let Some((r, bytes)) = partial.filter(|(r, _)| self.slots.reqs[r.index()].streamed()) {
            (self.slots).stream_sent(r, bytes, &mut self.conns, &mut self.io);
        }
        self.sent = sent;
        self.sent.clear();
    }

    /// Releases the replies queued on a closing connection: no send covers
    /// them any more.
    pub(super) fn drop_replies(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        debug_assert_ne!(c.send, SendOp::InFlight);
        c.out.drain_replies(&mut self.sent);
        let queued = std::mem::take(&mut self.sent);
        for &r in &queued {
            if self.slots.reqs[r.index()].streamed() {
                self.pieces(|s, c, p| s.abandon_stream(r, c, p));
            } else {
                self.release(r);
            }
        }
        self.sent = queued;
        self.sent.clear();
    }
}
