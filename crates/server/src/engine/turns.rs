//! When a READ may start on its connection. A streamed READ's reply holds
//! the socket from its header to its last piece, so a READ whose data is
//! read while a stream is being sent waits behind it holding buffers, and
//! out of reach of its flow's window. Enough of those take the pool, and
//! the stream they wait for cannot get a buffer for its next piece.
//!
//! So a stream starts once every READ before it on its connection has its
//! data queued to send (those go out ahead of it), and READs after it
//! start once it holds every buffer it will take (its last piece has its
//! buffer): it then needs nothing more from the pool, and what they hold
//! waits only behind pieces at the device or being sent. Every buffer a
//! READ holds is then either at the device, ahead of or in the reply being
//! sent, or the stream's own: all of it moves. Starting them only at the
//! stream's end drained the connection's pipeline at every stream (a
//! single host's 1 MiB reads reached 69% of its link).
//!
//! READs wait in the connection's `deferred` queue (`ReqStage::Deferred`),
//! in arrival order; they commit their buffers as they arrive, so the
//! connection's cap still bounds what it parses.

use std::collections::VecDeque;

use super::ids::ReqId;

/// One connection's READ turns: the READs started whose data is not yet
/// queued to send (a streamed READ's until it ends), the stream among them,
/// and the READs waiting for their turn, in arrival order.
#[derive(Debug, Default)]
pub struct Turns {
    pending: u32,
    stream: Option<ReqId>,
    waiting: VecDeque<ReqId>,
}

impl Turns {
    /// Whether a new READ (a stream, or a whole one) may start now: none
    /// waits before it, and its turn has come.
    pub fn may_start(&self, streamed: bool) -> bool {
        self.waiting.is_empty() && self.turn_come(streamed)
    }

    /// A stream once no other READ is pending, a whole READ while no
    /// stream is.
    fn turn_come(&self, streamed: bool) -> bool {
        if streamed {
            self.pending == 0
        } else {
            self.stream.is_none()
        }
    }

    /// READ `id` waits for its turn.
    pub fn wait(&mut self, id: ReqId) {
        self.waiting.push_back(id);
    }

    /// READ `id` starts: pending, and (a stream) alone.
    pub fn start(&mut self, id: ReqId, streamed: bool) {
        self.pending += 1;
        if streamed {
            debug_assert!(self.stream.is_none(), "two streams at once");
            self.stream = Some(id);
        }
    }

    /// A whole READ queued its data to send.
    pub fn queued(&mut self) {
        debug_assert!(self.pending > 0, "a READ never started");
        self.pending -= 1;
    }

    /// Stream `id` holds every buffer it will take: READs after it may
    /// start, since what they hold waits only behind pieces that move.
    pub fn buffered(&mut self, id: ReqId) {
        if self.stream == Some(id) {
            self.stream = None;
        }
    }

    /// READ `id` ended before its data was queued, or it was a stream.
    pub fn ended(&mut self, id: ReqId) {
        debug_assert!(self.pending > 0, "a READ never started");
        self.pending -= 1;
        if self.stream == Some(id) {
            self.stream = None;
        }
    }

    /// The first waiting READ, if its turn has come (`streamed` says
    /// whether a READ is a stream): it leaves the queue.
    pub fn next(&mut self, streamed: impl Fn(ReqId) -> bool) -> Option<ReqId> {
        let &id = self.waiting.front()?;
        if !self.turn_come(streamed(id)) {
            return None;
        }
        self.waiting.pop_front()
    }

    /// READ `id` no longer waits (its connection closed).
    pub fn forget(&mut self, id: ReqId) {
        self.waiting.retain(|&r| r != id);
    }

    /// READs started and not yet queued (or, a stream, not ended); these
    /// three are read by `Engine::audit`. `stream` is the stream that may
    /// still take buffers.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    pub fn stream(&self) -> Option<ReqId> {
        self.stream
    }

    pub fn waiting(&self) -> impl Iterator<Item = &ReqId> {
        self.waiting.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_starts_alone_and_reads_wait_behind_it() {
        let mut t = Turns::default();
        assert!(t.may_start(false));
        t.start(ReqId(1), false);
        assert!(!t.may_start(true), "a stream waits for the pending READ");
        t.wait(ReqId(2));
        assert!(!t.may_start(false), "nothing passes a waiting READ");
        t.wait(ReqId(3));
        assert_eq!(t.next(|r| r == ReqId(2)), None, "its turn has not come");
        t.queued();
        assert_eq!(t.next(|r| r == ReqId(2)), Some(ReqId(2)));
        t.start(ReqId(2), true);
        assert_eq!(
            t.next(|r| r == ReqId(2)),
            None,
            "READ 3 waits for the stream"
        );
        t.ended(ReqId(2));
        assert_eq!(t.stream(), None);
        assert_eq!(t.next(|r| r == ReqId(2)), Some(ReqId(3)));
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn reads_start_once_the_stream_holds_all_its_buffers() {
        let mut t = Turns::default();
        t.start(ReqId(1), true);
        t.wait(ReqId(2));
        t.wait(ReqId(3));
        let stream = |r: ReqId| r == ReqId(3);
        assert_eq!(
            t.next(stream),
            None,
            "READ 2 waits for the stream's buffers"
        );
        t.buffered(ReqId(1));
        assert_eq!(t.next(stream), Some(ReqId(2)));
        t.start(ReqId(2), false);
        assert_eq!(
            t.next(stream),
            None,
            "a second stream waits for the first to end"
        );
        t.queued();
        assert_eq!(t.next(stream), None);
        t.ended(ReqId(1));
        assert_eq!(t.next(stream), Some(ReqId(3)));
    }
}
