//! Replies: queued per connection in send order, and sent in batches, one
//! sendmsg with many iovecs per connection per round.

use super::conn::{EndReason, Life, SendOp, MAX_SEND_IOV};
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
        c.send_iov.clear();
        if !c.raw_out.is_empty() || !c.raw_sending.is_empty() {
            if c.raw_sending.is_empty() {
                std::mem::swap(&mut c.raw_out, &mut c.raw_sending);
            }
            c.send_iov.push(libc::iovec {
                iov_base: c.raw_sending.as_mut_ptr().cast(),
                iov_len: c.raw_sending.len(),
            });
        } else {
            let mut skip = c.out_skip;
            for &r in c.out.iter() {
                let req = &self.slots.reqs[r.index()];
                if c.send_iov.len() + req.reply_iov_len() > MAX_SEND_IOV {
                    break;
                }
                let whole = req.push_reply_iov(&mut c.send_iov, skip, self.io.buf_size);
                skip = 0;
                if !whole {
                    // A streamed READ's later pieces come first: in order.
                    break;
                }
            }
        }
        if c.send_iov.is_empty() {
            c.set_send(SendOp::Idle);
            self.touched.push(id);
            return;
        }
        c.msg.msg_iov = c.send_iov.as_mut_ptr();
        c.msg.msg_iovlen = c.send_iov.len();
        c.set_send(SendOp::InFlight);
        let msg = &*c.msg as *const libc::msghdr;
        self.io.actions.push(Action::Send { conn: id, msg });
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
        self.touched.push(id);
        if let Sent::Bytes(n) = result {
            self.io.stats.bytes_out += n as u64;
            c.traffic.bytes_out += n as u64;
        }
        if c.life == Life::Closing {
            // The replies the send covered may go now.
            c.raw_sending.clear();
            self.drop_replies(id);
            return;
        }
        let mut sent = match result {
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
        let mut partial = None;
        if !c.raw_sending.is_empty() {
            debug_assert!(sent <= c.raw_sending.len());
            c.raw_sending.drain(..sent.min(c.raw_sending.len()));
        } else {
            while let Some(&r) = c.out.front() {
                let size = self.slots.reqs[r.index()].reply_len(self.io.buf_size) - c.out_skip;
                if sent < size {
                    c.out_skip += sent;
                    partial = Some((r, c.out_skip));
                    sent = 0;
                    break;
                }
                sent -= size;
                c.out_skip = 0;
                c.out.pop_front();
                c.streams_out -= u32::from(self.slots.reqs[r.index()].streamed());
                self.sent.push(r);
            }
            debug_assert_eq!(sent, 0, "{id:?}: sent more than was queued");
        }
        let more = !c.raw_out.is_empty() || !c.raw_sending.is_empty() || !c.out.is_empty();
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
                self.stream_sent(r, usize::MAX);
                if self.slots.reqs[r.index()].pieces_live > 0 {
                    // A chunked reply ended early by a failed piece: the
                    // pieces past it are dropped as they come back.
                    self.io
                        .stats
                        .record_done(&self.slots.reqs[r.index()].served(), self.io.now);
                    self.abandon_stream(r);
                    continue;
                }
            }
            self.set_state(r, ReqStage::Sent);
            self.advance(r);
        }
        if let Some((r, bytes)) = partial.filter(|(r, _)| self.slots.reqs[r.index()].streamed()) {
            self.stream_sent(r, bytes);
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
        c.out_skip = 0;
        self.sent.extend(c.out.drain(..));
        c.streams_out = 0;
        let queued = std::mem::take(&mut self.sent);
        for &r in &queued {
            if self.slots.reqs[r.index()].streamed() {
                self.abandon_stream(r);
            } else {
                self.release(r);
            }
        }
        self.sent = queued;
        self.sent.clear();
    }
}
