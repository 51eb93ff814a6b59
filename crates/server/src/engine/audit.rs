//! The engine's books, checked against each other: buffers, commitments,
//! payload pieces, requests, READ turns, and the pacer's queued IOs and
//! bytes in flight, each counted twice. The property tests call
//! [`Engine::audit`] after every event, and so does the simulator's fault
//! fuzzer (`iopace sim --faults`); a driver never needs it.

use std::collections::HashMap;

use super::conn::{Conn, RecvOp};
use super::ids::{ConnId, IoToken, ReqId};
use super::req::{PieceState, ReqState};
use super::Engine;

/// Returns the broken book as an error, naming it.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Per connection: requests, commitments, WRITE pieces awaiting payload.
type ConnBooks = (u32, u32, u32);

impl Engine {
    /// Checks every book against its second count; the first that does
    /// not balance is returned, named.
    pub fn audit(&self) -> Result<(), String> {
        let mut per_conn: HashMap<ConnId, ConnBooks> = HashMap::new();
        let bufs = self.audit_requests(&mut per_conn)?;
        ensure!(
            self.bufs.in_use() == bufs,
            "buffers held {} vs. buffers counted {bufs}",
            self.bufs.in_use()
        );
        ensure!(
            self.free_reqs.len() + self.requests_in_use() == self.reqs.len(),
            "free list and slots"
        );
        let live = self
            .reqs
            .iter()
            .filter(|r| r.state != ReqState::Free)
            .count();
        ensure!(
            self.requests_in_use() == live,
            "free list vs. slot states: {} vs. {live}",
            self.requests_in_use()
        );
        ensure!(
            self.stats.requests_in_flight() == live as u64,
            "state statistics vs. slot states: {} vs. {live}",
            self.stats.requests_in_flight()
        );
        for c in self.conns.iter().flatten() {
            let books = per_conn.get(&c.id).copied().unwrap_or_default();
            self.audit_conn(c, books)?;
        }
        self.audit_pacer()
    }

    /// Bytes received and sent since the start, as counted: a driver
    /// checks them against what it moved.
    pub fn bytes_moved(&self) -> (u64, u64) {
        (self.stats.bytes_in, self.stats.bytes_out)
    }

    /// Each live request's books, added up per connection; returns the
    /// buffers the requests hold.
    fn audit_requests(&self, per_conn: &mut HashMap<ConnId, ConnBooks>) -> Result<u64, String> {
        let mut bufs = 0u64;
        for (i, r) in self.reqs.iter().enumerate() {
            if r.state == ReqState::Free {
                ensure!(
                    r.bufs.is_empty() && r.pieces.is_empty(),
                    "free slot {i} holds data"
                );
                continue;
            }
            let held = r.pieces.iter().filter(|p| p.buf.is_some()).count();
            bufs += (r.bufs.len() + held) as u64;
            ensure!(
                self.conn_ref(r.conn).is_some(),
                "request {i} outlived {:?}",
                r.conn
            );
            let entry = per_conn.entry(r.conn).or_default();
            entry.0 += 1;
            entry.1 += self.commitment(ReqId(i as u32));
            if r.streamed() {
                // A streamed READ's window is its own.
                ensure!(
                    r.pieces_live <= self.payload_cap,
                    "request {i} over its window"
                );
                ensure!(
                    r.sent_pieces <= r.started && r.started as usize <= r.pieces.len(),
                    "request {i}: pieces sent {} started {} of {}",
                    r.sent_pieces,
                    r.started,
                    r.pieces.len()
                );
            } else {
                // Under the payload cap: pieces still waiting for their payload.
                let awaiting = r.pieces.iter().filter(|p| {
                    matches!(
                        p.state,
                        PieceState::Pacing | PieceState::NeedBuffer | PieceState::Filling
                    )
                });
                entry.2 += awaiting.count() as u32;
            }
        }
        Ok(bufs)
    }

    /// One connection's books against what its requests hold.
    fn audit_conn(&self, c: &Conn, (n, committed, pieces): ConnBooks) -> Result<(), String> {
        if let RecvOp::Direct(r) = c.recv {
            // The kernel writes into that buffer: it must still be ours.
            let req = &self.reqs[r.index()];
            let k = req.filling_piece(self.buf_size) as usize;
            ensure!(
                req.state == ReqState::Payload,
                "{:?} receives into a dead write",
                c.id
            );
            ensure!(
                req.pieces.get(k).is_some_and(|p| p.buf.is_some()),
                "{:?} receives into a freed buffer",
                c.id
            );
        }
        let streams = c
            .out
            .iter()
            .filter(|r| self.reqs[r.index()].streamed())
            .count();
        ensure!(
            c.streams_out as usize == streams,
            "{:?} streams queued {} vs. {streams}",
            c.id,
            c.streams_out
        );
        self.audit_turns(c)?;
        ensure!(
            c.requests == n,
            "{:?} requests {} vs. {n}",
            c.id,
            c.requests
        );
        ensure!(
            c.committed == committed,
            "{:?} commitments {} vs. {committed}",
            c.id,
            c.committed
        );
        ensure!(
            c.payload_pieces == pieces,
            "{:?} payload pieces {} vs. {pieces}",
            c.id,
            c.payload_pieces
        );
        ensure!(
            c.payload_pieces <= self.payload_cap,
            "{:?} over its payload cap",
            c.id
        );
        Ok(())
    }

    /// A connection's READ turns (`turns.rs`) against its requests: the
    /// waiting ones are in its queue in order, the pending ones counted,
    /// and a stream runs alone.
    fn audit_turns(&self, c: &Conn) -> Result<(), String> {
        let mine = (0..self.reqs.len() as u32)
            .map(ReqId)
            .filter(|r| {
                let req = &self.reqs[r.index()];
                req.conn == c.id && req.state != ReqState::Free
            })
            .collect::<Vec<_>>();
        let deferred = mine
            .iter()
            .filter(|r| self.reqs[r.index()].state == ReqState::Deferred)
            .count();
        ensure!(
            c.deferred.len() == deferred,
            "{:?} READs deferred {} vs. {deferred}",
            c.id,
            c.deferred.len()
        );
        for r in &c.deferred {
            ensure!(
                self.reqs[r.index()].state == ReqState::Deferred,
                "{:?}: {r:?} queued for its turn, not deferred",
                c.id
            );
        }
        let pending: Vec<ReqId> = mine.into_iter().filter(|r| self.read_pending(*r)).collect();
        ensure!(
            c.reads_pending as usize == pending.len(),
            "{:?} READs pending {} vs. {}",
            c.id,
            c.reads_pending,
            pending.len()
        );
        let streams: Vec<ReqId> = pending
            .iter()
            .copied()
            .filter(|r| self.reqs[r.index()].streamed())
            .collect();
        ensure!(
            c.stream.into_iter().collect::<Vec<_>>() == streams,
            "{:?} stream {:?} vs. {streams:?}",
            c.id,
            c.stream
        );
        ensure!(
            c.stream.is_none() || pending.len() == 1,
            "{:?}: a stream beside other READs",
            c.id
        );
        Ok(())
    }

    /// The pacer's books against the requests': what each request's state
    /// says of its IOs (queued, released, done) is what the pacer holds,
    /// and the pacer holds nothing else.
    fn audit_pacer(&self) -> Result<(), String> {
        let (mut queued, mut bytes) = (0usize, 0u64);
        for (i, r) in self.reqs.iter().enumerate() {
            let id = ReqId(i as u32);
            if r.paced {
                let want = match r.state {
                    ReqState::Free | ReqState::Deferred => Paced::Out,
                    ReqState::Pacing => Paced::Queued,
                    _ => Paced::InFlight,
                };
                bytes += self.audit_paced(IoToken::whole(id), want, r.len, &mut queued)?;
            }
            for (k, p) in r.pieces.iter().enumerate() {
                let want = match p.state {
                    PieceState::Pacing => Paced::Queued,
                    // A streamed READ's piece leaves the pacer when sent.
                    PieceState::Ready if r.streamed() => Paced::InFlight,
                    PieceState::Idle | PieceState::Ready | PieceState::Done => Paced::Out,
                    _ => Paced::InFlight,
                };
                let len = r.piece_len(k as u32, self.buf_size);
                let token = IoToken::piece(id, k as u32);
                bytes += self.audit_paced(token, want, len, &mut queued)?;
            }
        }
        ensure!(
            self.pacer.queued() == queued,
            "IOs queued in the pacer {} vs. {queued}",
            self.pacer.queued()
        );
        ensure!(
            self.pacer.bytes_in_flight() == bytes,
            "bytes in flight in the pacer {} vs. {bytes}",
            self.pacer.bytes_in_flight()
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
        let flying = self.pacer.in_flight(token.encode());
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
