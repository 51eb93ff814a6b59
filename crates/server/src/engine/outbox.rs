//! A connection's send side: the raw bytes (handshake, NVMe/TCP PDUs its
//! queue wrote) and the replies queued in send order, laid out as one
//! sendmsg with many iovecs per round, and consumed as sends complete.

use std::collections::VecDeque;

use super::ids::ReqId;
use super::slot::Req;

/// Most iovecs in one sendmsg.
pub const MAX_SEND_IOV: usize = 512;

pub struct Outbox {
    /// Raw bytes waiting to be sent, and those in the current send.
    raw: Vec<u8>,
    raw_sending: Vec<u8>,
    /// Requests whose replies are ready, in send order. While a send is in
    /// flight it covers a prefix of this queue.
    replies: VecDeque<ReqId>,
    /// Streamed READs in `replies`.
    streams: u32,
    /// Bytes of `replies[0]`'s reply already sent (partial sends).
    skip: usize,
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
}

impl Outbox {
    pub fn new() -> Outbox {
        // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
        let msg: libc::msghdr = unsafe { std::mem::zeroed() };
        Outbox {
            raw: Vec::new(),
            raw_sending: Vec::new(),
            replies: VecDeque::new(),
            streams: 0,
            skip: 0,
            iov: Vec::with_capacity(MAX_SEND_IOV),
            msg: Box::new(msg),
        }
    }

    /// Queues raw bytes (handshake answers, NVMe/TCP PDUs) behind the
    /// others.
    pub fn push_raw(&mut self, bytes: &[u8]) {
        self.raw.extend_from_slice(bytes);
    }

    /// The connection closed under a send: the raw bytes it carried are
    /// dropped.
    pub fn drop_raw_sending(&mut self) {
        self.raw_sending.clear();
    }

    /// The requests whose replies are queued, in send order.
    pub fn replies(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.replies.iter().copied()
    }

    /// Streamed READs among the queued replies.
    pub fn streams(&self) -> u32 {
        self.streams
    }

    /// Queues `id`'s reply (its header encoded) behind the others.
    pub fn push(&mut self, id: ReqId, streamed: bool) {
        self.streams += u32::from(streamed);
        self.replies.push_back(id);
    }

    /// Raw bytes are waiting or being sent.
    pub fn has_raw(&self) -> bool {
        !self.raw.is_empty() || !self.raw_sending.is_empty()
    }

    /// Something is left to send.
    pub fn has_more(&self) -> bool {
        self.has_raw() || !self.replies.is_empty()
    }

    /// The next sendmsg: the raw bytes, or every queued reply that fits;
    /// None when there is nothing to send. Its iovecs point into memory
    /// kept in place until the send completes.
    pub fn next_msg(&mut self, reqs: &[Req], buf_size: u32) -> Option<*const libc::msghdr> {
        self.iov.clear();
        // Raw bytes (the handshake's, NVMe/TCP's R2Ts and completions) go
        // between replies, never into one a short send cut.
        let raw = !self.raw_sending.is_empty() || !self.raw.is_empty() && self.skip == 0;
        if raw {
            if self.raw_sending.is_empty() {
                std::mem::swap(&mut self.raw, &mut self.raw_sending);
            }
            self.iov.push(libc::iovec {
                iov_base: self.raw_sending.as_mut_ptr().cast(),
                iov_len: self.raw_sending.len(),
            });
        } else {
            let mut skip = self.skip;
            for &r in self.replies.iter() {
                let req = &reqs[r.index()];
                if self.iov.len() + req.reply_iov_len() > MAX_SEND_IOV {
                    break;
                }
                let whole = req.push_reply_iov(&mut self.iov, skip, buf_size);
                skip = 0;
                if !whole {
                    // A streamed READ's later pieces come first: in order.
                    break;
                }
            }
        }
        if self.iov.is_empty() {
            return None;
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
        Some(&*self.msg as *const libc::msghdr)
    }

    /// `sent` bytes of the last sendmsg left: raw bytes drop, replies
    /// wholly sent move to `done`. Returns a reply partly sent and how far
    /// (a streamed READ's progress).
    pub fn sent(
        &mut self,
        mut sent: usize,
        reqs: &[Req],
        buf_size: u32,
        done: &mut Vec<ReqId>,
    ) -> Option<(ReqId, usize)> {
        if !self.raw_sending.is_empty() {
            debug_assert!(sent <= self.raw_sending.len());
            self.raw_sending.drain(..sent.min(self.raw_sending.len()));
            return None;
        }
        let mut partial = None;
        while let Some(&r) = self.replies.front() {
            let size = reqs[r.index()].reply_len(buf_size) - self.skip;
            if sent < size {
                self.skip += sent;
                partial = Some((r, self.skip));
                sent = 0;
                break;
            }
            sent -= size;
            self.skip = 0;
            self.replies.pop_front();
            self.streams -= u32::from(reqs[r.index()].streamed());
            done.push(r);
        }
        debug_assert_eq!(sent, 0, "sent more than was queued");
        partial
    }

    /// Empties the reply queue into `into` (its connection closed).
    pub fn drain_replies(&mut self, into: &mut Vec<ReqId>) {
        self.skip = 0;
        into.extend(self.replies.drain(..));
        self.streams = 0;
    }
}
