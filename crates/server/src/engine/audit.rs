//! The engine's books, checked against each other: buffers, commitments,
//! payload pieces, requests, READ turns, and the pacer's queued IOs and
//! bytes in flight, each counted twice. The property tests call
//! [`super::Engine::audit`] after every event, and so does the simulator's fault
//! fuzzer (`iopace sim --faults`); a driver never needs it.

use super::conn::Conn;
use super::conn_state::RecvOp;
use super::conns::Conns;
use super::ids::{IoToken, ReqId};
use super::io_path::IoPath;
use super::pieces::all_buffered;
use super::slots::Slots;
use super::states::{PieceState, ReqStage};

/// Returns the broken book as an error, naming it.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The engine's parts, read for their books.
pub struct Books<'a> {
    pub slots: &'a Slots,
    pub conns: &'a Conns,
    pub io: &'a IoPath,
}

/// What a connection's requests hold, counted from the requests.
#[derive(Debug, Default)]
struct ConnBooks {
    requests: u32,
    committed: u32,
    /// WRITE pieces awaiting their payload.
    pieces: u32,
    /// READs waiting for their turn, and READs pending (`turns.rs`).
    deferred: u32,
    pending: u32,
    /// Streamed READs pending, in slot order.
    streams: Vec<ReqId>,
}

impl Books<'_> {
    /// Checks every book against its second count; the first that does
    /// not balance is returned, named. Linear in slots and connections.
    pub fn check(&self) -> Result<(), String> {
        let mut per_conn: Vec<ConnBooks> = Vec::new();
        per_conn.resize_with(self.conns.slots(), ConnBooks::default);
        let bufs = self.audit_requests(&mut per_conn)?;
        ensure!(
            self.io.bufs().in_use() == bufs,
            "buffers held {} vs. buffers counted {bufs}",
            self.io.bufs().in_use()
        );
        ensure!(
            self.slots.free_count() + self.slots.in_use() == self.slots.reqs().len(),
            "free list and slots"
        );
        let live = self
            .slots
            .reqs()
            .iter()
            .filter(|r| r.state() != ReqStage::Free)
            .count();
        ensure!(
            self.slots.in_use() == live,
            "free list vs. slot states: {} vs. {live}",
            self.slots.in_use()
        );
        ensure!(
            self.io.stats().requests_in_flight() == live as u64,
            "state statistics vs. slot states: {} vs. {live}",
            self.io.stats().requests_in_flight()
        );
        for c in self.conns.iter() {
            self.audit_conn(c, &per_conn[c.id().index as usize])?;
        }
        self.audit_pacer()
    }

    /// Each live request's books, added up per connection; returns the
    /// buffers the requests hold.
    fn audit_requests(&self, per_conn: &mut [ConnBooks]) -> Result<u64, String> {
        let mut bufs = 0u64;
        for (i, r) in self.slots.reqs().iter().enumerate() {
            if r.state() == ReqStage::Free {
                ensure!(
                    r.bufs().is_empty() && r.pieces().is_empty(),
                    "free slot {i} holds data"
                );
                continue;
            }
            let held = r.pieces().iter().filter(|p| p.buf.is_some()).count();
            bufs += (r.bufs().len() + held) as u64;
            ensure!(
                self.conns.get(r.conn()).is_some(),
                "request {i} outlived {:?}",
                r.conn()
            );
            let id = ReqId(i as u32);
            let books = &mut per_conn[r.conn().index as usize];
            books.requests += 1;
            books.committed += self.io.commitment(r);
            books.deferred += u32::from(r.state() == ReqStage::Deferred);
            if r.read_pending() {
                books.pending += 1;
                if r.streamed() {
                    books.streams.push(id);
                }
            }
            if r.streamed() {
                // A streamed READ's window is its own.
                ensure!(
                    r.pieces_live() <= self.io.payload_cap(),
                    "request {i} over its window"
                );
                ensure!(
                    r.sent_pieces() <= r.started() && r.started() as usize <= r.pieces().len(),
                    "request {i}: pieces sent {} started {} of {}",
                    r.sent_pieces(),
                    r.started(),
                    r.pieces().len()
                );
            } else {
                // Under the payload cap: pieces still waiting for their payload.
                let awaiting = r.pieces().iter().filter(|p| {
                    matches!(
                        p.state,
                        PieceState::Pacing | PieceState::NeedBuffer | PieceState::Filling
                    )
                });
                books.pieces += awaiting.count() as u32;
            }
        }
        Ok(bufs)
    }

    /// One connection's books against what its requests hold.
    fn audit_conn(&self, c: &Conn, books: &ConnBooks) -> Result<(), String> {
        if let RecvOp::H2c(r) = c.recv() {
            // The kernel writes into its buffers: they must still be ours.
            let req = &self.slots[r];
            ensure!(
                req.state() == ReqStage::Receiving && !req.bufs().is_empty(),
                "{:?} receives H2CData into a dead write",
                c.id()
            );
        }
        if let RecvOp::Direct(r) = c.recv() {
            // The kernel writes into that buffer: it must still be ours.
            let req = &self.slots[r];
            let k = req.filling_piece(self.io.buf_size()) as usize;
            ensure!(
                req.state() == ReqStage::Payload,
                "{:?} receives into a dead write",
                c.id()
            );
            ensure!(
                req.pieces().get(k).is_some_and(|p| p.buf.is_some()),
                "{:?} receives into a freed buffer",
                c.id()
            );
        }
        let streams = (c.out().replies())
            .filter(|&r| self.slots[r].streamed())
            .count();
        ensure!(
            c.out().streams() as usize == streams,
            "{:?} streams queued {} vs. {streams}",
            c.id(),
            c.out().streams()
        );
        self.audit_turns(c, books)?;
        ensure!(
            c.requests() == books.requests,
            "{:?} requests {} vs. {}",
            c.id(),
            c.requests(),
            books.requests
        );
        ensure!(
            c.committed() == books.committed,
            "{:?} commitments {} vs. {}",
            c.id(),
            c.committed(),
            books.committed
        );
        ensure!(
            c.payload_pieces() == books.pieces,
            "{:?} payload pieces {} vs. {}",
            c.id(),
            c.payload_pieces(),
            books.pieces
        );
        ensure!(
            c.payload_pieces() <= self.io.payload_cap(),
            "{:?} over its payload cap",
            c.id()
        );
        Ok(())
    }

    /// A connection's READ turns (`turns.rs`) against its requests: the
    /// waiting ones are in its queue, the pending ones counted, and a
    /// stream runs alone.
    fn audit_turns(&self, c: &Conn, books: &ConnBooks) -> Result<(), String> {
        let waiting = c.turns().waiting().count();
        ensure!(
            waiting == books.deferred as usize,
            "{:?} READs deferred {waiting} vs. {}",
            c.id(),
            books.deferred
        );
        for r in c.turns().waiting() {
            let req = &self.slots[*r];
            ensure!(
                req.state() == ReqStage::Deferred && req.conn() == c.id(),
                "{:?}: {r:?} queued for its turn, not deferred",
                c.id()
            );
        }
        ensure!(
            c.turns().pending() == books.pending,
            "{:?} READs pending {} vs. {}",
            c.id(),
            c.turns().pending(),
            books.pending
        );
        // The stream that may still take buffers runs alone; one that
        // holds all of its buffers may have READs started after it.
        let stream = c.turns().stream();
        ensure!(
            stream.is_none_or(|s| books.streams == [s] && books.pending == 1),
            "{:?}: stream {stream:?} beside other READs (streams {:?})",
            c.id(),
            books.streams
        );
        for &s in books.streams.iter().filter(|&&s| Some(s) != stream) {
            ensure!(
                all_buffered(&self.slots[s]),
                "{:?}: {s:?} lets READs pass before it holds its buffers",
                c.id()
            );
        }
        Ok(())
    }

    /// The pacer's books against the requests': what each request's state
    /// says of its IOs (queued, released, done) is what the pacer holds,
    /// and the pacer holds nothing else.
    fn audit_pacer(&self) -> Result<(), String> {
        let (mut queued, mut bytes) = (0usize, 0u64);
        for (i, r) in self.slots.reqs().iter().enumerate() {
            let id = ReqId(i as u32);
            if r.paced() {
                let want = match r.state() {
                    ReqStage::Free | ReqStage::Deferred => Paced::Out,
                    ReqStage::Pacing => Paced::Queued,
                    _ => Paced::InFlight,
                };
                bytes += self.audit_paced(IoToken::whole(id), want, r.len(), &mut queued)?;
            }
            for (k, p) in r.pieces().iter().enumerate() {
                let want = match p.state {
                    PieceState::Pacing => Paced::Queued,
                    // A streamed READ's piece leaves the pacer when sent.
                    PieceState::Ready if r.streamed() => Paced::InFlight,
                    PieceState::Idle | PieceState::Ready | PieceState::Done => Paced::Out,
                    _ => Paced::InFlight,
                };
                let len = r.piece_len(k as u32, self.io.buf_size());
                let token = IoToken::piece(id, k as u32);
                bytes += self.audit_paced(token, want, len, &mut queued)?;
            }
        }
        ensure!(
            self.io.pacer().queued() == queued,
            "IOs queued in the pacer {} vs. {queued}",
            self.io.pacer().queued()
        );
        ensure!(
            self.io.pacer().bytes_in_flight() == bytes,
            "bytes in flight in the pacer {} vs. {bytes}",
            self.io.pacer().bytes_in_flight()
        );
        Ok(())
    }

    /// One IO where the request says it is; returns the bytes the pacer
    /// counts in flight for it.
    fn audit_paced(
        &self,
        token: IoToken,
        want: Paced,
        len: u32,
        queued: &mut usize,
    ) -> Result<u64, String> {
        let flying = self.io.pacer().in_flight(token.encode());
        match want {
            Paced::Queued => *queued += 1,
            _ => ensure!(
                flying == (want == Paced::InFlight),
                "{token:?} in the pacer: {flying}, expected {want:?}"
            ),
        }
        Ok(if flying { u64::from(len) } else { 0 })
    }
}

/// Where an IO should be, as the pacer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paced {
    Queued,
    InFlight,
    Out,
}
