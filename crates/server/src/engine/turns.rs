//! When a READ may start on its connection. A streamed READ's reply holds
//! the socket from its header to its last piece, so a READ whose data is
//! read while a stream is being sent waits behind it holding buffers, and
//! out of reach of its flow's window. Enough of those take the pool, and
//! the stream they wait for cannot get a buffer for its next piece.
//!
//! So a stream runs alone: it starts once every READ before it on its
//! connection has its data queued to send (those go out ahead of it), and
//! READs after it start once it has ended. Every buffer a READ holds is
//! then either at the device, ahead of or in the reply being sent, or the
//! stream's own: all of it moves.
//!
//! READs wait in the connection's `deferred` queue (`ReqStage::Deferred`),
//! in arrival order; they commit their buffers as they arrive, so the
//! connection's cap still bounds what it parses.

use super::conn::Life;
use super::ids::{ConnId, IoToken, ReqId};
use super::slot::ReqStage;
use super::{conn_at, Engine};
use pace::pacer::IoKind;

impl Engine {
    /// New READ `id` (paced whole, or planned as a stream): starts now if
    /// its turn has come, else waits for it.
    pub(super) fn read_turn(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.reqs[id.index()].streamed();
        let conn = self.reqs[id.index()].conn;
        let Some(c) = conn_at(&mut self.conns, conn) else {
            return self.start_read(id);
        };
        if c.deferred.is_empty() && turn_come(c, streamed) {
            return self.start_read(id);
        }
        c.deferred.push_back(id);
        ReqStage::Deferred
    }

    /// READ `id`'s turn has come: a stream claims its connection, a whole
    /// READ goes to the pacer.
    fn start_read(&mut self, id: ReqId) -> ReqStage {
        let streamed = self.reqs[id.index()].streamed();
        let conn = self.reqs[id.index()].conn;
        if let Some(c) = conn_at(&mut self.conns, conn) {
            c.reads_pending += 1;
            if streamed {
                debug_assert!(c.stream.is_none(), "{conn:?}: two streams at once");
                c.stream = Some(id);
            }
        }
        if streamed {
            return ReqStage::Streaming;
        }
        let io = self.paced_io(IoToken::whole(id), IoKind::Read);
        self.pacer.enqueue(io, self.now);
        ReqStage::Pacing
    }

    /// Whether READ `id`, being released, still counts as pending on its
    /// connection: started, and its data not yet queued (a stream's: not
    /// yet all sent).
    pub(super) fn read_pending(&self, id: ReqId) -> bool {
        let req = &self.reqs[id.index()];
        match req.state {
            ReqStage::Deferred => false,
            _ if req.streamed() => true,
            ReqStage::Reply | ReqStage::Sent => false,
            _ => req.paced && req.command == proto::Command::Read,
        }
    }

    /// Whole READ on `conn` queued its data to send.
    pub(super) fn read_queued(&mut self, conn: ConnId) {
        if let Some(c) = conn_at(&mut self.conns, conn) {
            debug_assert!(c.reads_pending > 0, "{conn:?}: a READ never started");
            c.reads_pending -= 1;
        }
        self.start_deferred(conn);
    }

    /// READ `id` on `conn` ended before its data was queued, or it was a
    /// stream: the READs waiting for it may start.
    pub(super) fn read_ended(&mut self, conn: ConnId, id: ReqId) {
        if let Some(c) = conn_at(&mut self.conns, conn) {
            debug_assert!(c.reads_pending > 0, "{conn:?}: a READ never started");
            c.reads_pending -= 1;
            if c.stream == Some(id) {
                c.stream = None;
            }
        }
        self.start_deferred(conn);
    }

    /// Starts the READs waiting on `conn` whose turn has come, in order.
    fn start_deferred(&mut self, conn: ConnId) {
        loop {
            let Some(c) = conn_at(&mut self.conns, conn) else {
                return;
            };
            // A closing connection's waiting READs are aborted, not started.
            let Some(&id) = c.deferred.front().filter(|_| c.life == Life::Open) else {
                return;
            };
            if !turn_come(c, self.reqs[id.index()].streamed()) {
                return;
            }
            c.deferred.pop_front();
            let to = self.start_read(id);
            self.set_state(id, to);
            self.advance(id);
        }
    }
}

/// Whether a READ (a stream, or a whole one) may start on `c` now: a
/// stream once no other READ is pending, a whole READ while no stream is.
fn turn_come(c: &super::conn::Conn, streamed: bool) -> bool {
    if streamed {
        c.reads_pending == 0
    } else {
        c.stream.is_none()
    }
}
