//! The trace ring: each engine's last [`TRACE_LEN`] request state changes
//! with their times, written by `Requests::set_state` (`Slots::set_state`), so that `iopace rpc
//! trace` can show where a request that hangs is and how it got there (as
//! SPDK's trace records each request's state changes). Recording is one
//! store into a fixed ring; reading it is for the control plane.

use pace::Nanos;
use serde::{Deserialize, Serialize};

use super::ids::ReqId;
use super::states::ReqStage;

/// State changes kept per engine: about 500 requests' whole lives.
pub const TRACE_LEN: usize = 4096;

#[derive(Debug, Clone, Copy)]
pub(super) struct TraceEntry {
    pub t: Nanos,
    pub req: ReqId,
    pub cookie: u64,
    pub to: ReqStage,
}

pub struct TraceRing {
    /// Every entry, written in turn; those past the next one's place are
    /// real only once `written` reached `TRACE_LEN`.
    entries: Box<[TraceEntry; TRACE_LEN]>,
    /// Entries recorded since the start: one count gives both where the
    /// next goes and whether the ring wrapped, one store per record.
    written: u64,
}

const NO_ENTRY: TraceEntry = TraceEntry {
    t: 0,
    req: ReqId(0),
    cookie: 0,
    to: ReqStage::Free,
};

impl TraceRing {
    pub fn new() -> TraceRing {
        TraceRing {
            entries: Box::new([NO_ENTRY; TRACE_LEN]),
            written: 0,
        }
    }

    /// One store: it runs on every state change of every request.
    pub fn record(&mut self, t: Nanos, req: ReqId, cookie: u64, to: ReqStage) {
        self.entries[self.written as usize % TRACE_LEN] = TraceEntry { t, req, cookie, to };
        self.written += 1;
    }

    /// Oldest first.
    pub(super) fn in_order(&self) -> impl Iterator<Item = &TraceEntry> {
        let next = self.written as usize % TRACE_LEN;
        let (newer, older) = self.entries.split_at(next);
        let wrapped = self.written >= TRACE_LEN as u64;
        let older = if wrapped { older } else { &older[..0] };
        older.iter().chain(newer)
    }

    /// The ring's oldest time: a life that began before it is cut.
    pub(super) fn since(&self) -> Option<Nanos> {
        self.in_order().next().map(|e| e.t)
    }
}

impl Default for TraceRing {
    fn default() -> Self {
        TraceRing::new()
    }
}

/// Which requests in flight `trace` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceQuery {
    /// Every request of connection slot `conn`.
    Conn(u32),
    /// The oldest this many.
    Oldest(usize),
}

/// One state a traced request entered, and when (since it arrived).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracedState {
    pub state: String,
    pub at_us: f64,
}

/// A request in flight and the state changes the ring still holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracedReq {
    pub reactor: usize,
    pub conn: u32,
    pub peer: String,
    pub cookie: u64,
    pub command: String,
    pub offset: u64,
    pub len: u64,
    pub state: String,
    pub age_us: f64,
    pub states: Vec<TracedState>,
    /// The ring no longer holds its first changes.
    pub cut: bool,
}

pub(super) fn us(ns: Nanos) -> f64 {
    ns as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_entries_in_order() {
        let mut ring = TraceRing::new();
        for i in 0..(TRACE_LEN as u64 + 10) {
            ring.record(i, ReqId(1), 7, ReqStage::New);
        }
        let times: Vec<Nanos> = ring.in_order().map(|e| e.t).collect();
        assert_eq!(times.len(), TRACE_LEN);
        assert_eq!(times[0], 10);
        assert!(times.windows(2).all(|w| w[0] + 1 == w[1]));
        assert_eq!(ring.since(), Some(10));
    }

    #[test]
    fn a_ring_not_yet_full_holds_what_was_recorded() {
        let mut ring = TraceRing::new();
        assert_eq!(ring.since(), None);
        for i in 0..5 {
            ring.record(100 + i, ReqId(2), 7, ReqStage::New);
        }
        let times: Vec<Nanos> = ring.in_order().map(|e| e.t).collect();
        assert_eq!(times, vec![100, 101, 102, 103, 104]);
        assert_eq!(ring.since(), Some(100));
        for i in 0..(TRACE_LEN as u64 - 5) {
            ring.record(200 + i, ReqId(2), 7, ReqStage::New);
        }
        // Exactly full: every entry, the first one oldest.
        assert_eq!(ring.in_order().count(), TRACE_LEN);
        assert_eq!(ring.since(), Some(100));
    }
}
