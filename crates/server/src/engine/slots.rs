//! The engine's request slots: preallocated, reused, handed out from a
//! free list; the connections waiting for one; each slot's state changes,
//! checked against the request diagram (`states.rs`) and kept in the
//! trace ring for `iopace rpc trace`.

use std::collections::VecDeque;

use bdev::IoRequest;
use pace::Nanos;
use pool::BufId;
use proto::Command;

use super::conn_state::{Life, Phase};
use super::conns::Conns;
use super::framing::ReqOrigin;
use super::ids::{ConnId, IoToken, Part, ReqId};
use super::io_path::IoPath;
use super::slot::Req;
use super::states::{PieceState, ReqStage};
use super::trace::{self, TraceQuery, TracedReq, TracedState};
use crate::exports::Catalog;
use crate::stats::StatsCollector;

/// Every request state, for the table of arrows.
const STAGES: [ReqStage; 17] = {
    use ReqStage::*;
    [
        Free,
        New,
        Deferred,
        Pacing,
        Released,
        NeedBuffers,
        Ready,
        Device,
        Executed,
        Delayed,
        Payload,
        Receiving,
        Streaming,
        Dropping,
        Answered,
        Reply,
        Sent,
    ]
};

/// `legal` as a table, checked on every state change: bit `to` of row
/// `from` (both as their discriminants).
const ARROWS: [u32; STAGES.len()] = {
    let mut rows = [0u32; STAGES.len()];
    let mut i = 0;
    while i < STAGES.len() {
        let mut j = 0;
        while j < STAGES.len() {
            if legal(STAGES[i], STAGES[j]) {
                rows[STAGES[i] as usize] |= 1 << STAGES[j] as usize;
            }
            j += 1;
        }
        i += 1;
    }
    rows
};

/// Whether `from -> to` is an arrow: `legal`, by a lookup.
fn arrow(from: ReqStage, to: ReqStage) -> bool {
    ARROWS[from as usize] & (1 << to as usize) != 0
}

/// A transition that is not an arrow: out of line, so that `set_state`
/// stays small.
#[cold]
#[inline(never)]
fn broken_arrow(id: ReqId, from: ReqStage, to: ReqStage) -> ! {
    panic!("request {id:?}: {from:?} -> {to:?}")
}

/// Whether `from -> to` is a transition of the request diagram
/// (`states.rs`).
const fn legal(from: ReqStage, to: ReqStage) -> bool {
    use ReqStage::*;
    matches!(
        (from, to),
        (Free, New)
            | (
                New,
                Deferred | Pacing | Payload | Streaming | Ready | Answered
            )
            | (Deferred, Pacing | Streaming)
            | (Streaming | Answered | Reply, Dropping)
            | (Streaming, Answered)
            | (Pacing, Released)
            | (Released, NeedBuffers | Ready | Receiving)
            | (NeedBuffers, Ready | Receiving)
            | (Receiving, Ready | Answered)
            | (Ready, Device | Answered)
            | (Device, Executed)
            | (Executed, Delayed | Answered | Ready)
            | (Delayed, Answered | Ready)
            | (Payload, Answered)
            | (Answered, Reply)
            | (Reply, Sent)
            | (
                Deferred
                    | Pacing
                    | NeedBuffers
                    | Payload
                    | Receiving
                    | Answered
                    | Reply
                    | Sent
                    | Dropping,
                Free
            )
    )
}

pub struct Slots {
    reqs: Vec<Req>,
    free: Vec<ReqId>,
    /// Connections waiting for a request slot, in arrival order.
    waiters: VecDeque<ConnId>,
    /// The last request state changes, with their times.
    trace: trace::TraceRing,
}

/// A slot's request, by id: every slot exists for the engine's life.
impl std::ops::Index<ReqId> for Slots {
    type Output = Req;
    fn index(&self, id: ReqId) -> &Req {
        &self.reqs[id.index()]
    }
}

impl std::ops::IndexMut<ReqId> for Slots {
    fn index_mut(&mut self, id: ReqId) -> &mut Req {
        &mut self.reqs[id.index()]
    }
}

impl Slots {
    pub fn new(n: u32) -> Slots {
        Slots {
            reqs: (0..n).map(|_| Req::default()).collect(),
            free: (0..n).rev().map(ReqId).collect(),
            waiters: VecDeque::new(),
            trace: trace::TraceRing::new(),
        }
    }

    /// Slots holding a request.
    pub fn in_use(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Slots, free or not: request ids run below it.
    pub fn total(&self) -> u32 {
        self.reqs.len() as u32
    }

    /// Every slot's request, by index (free ones too).
    pub fn reqs(&self) -> &[Req] {
        &self.reqs
    }

    /// The request `id` names, if it is a slot's.
    pub fn get(&self, id: ReqId) -> Option<&Req> {
        self.reqs.get(id.index())
    }

    /// Slots on the free list (the audit counts them against the states).
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// A free slot for a new request.
    pub fn claim(&mut self) -> Option<ReqId> {
        self.free.pop()
    }

    /// `conn` waits in line for a slot (`next_waiter`), once.
    pub fn wait_for_slot(&mut self, conn: ConnId) {
        if !self.waiters.contains(&conn) {
            self.waiters.push_back(conn);
        }
    }

    /// Whether a slot is free (a claim would succeed).
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Slot `slot`, claimed, starts request `request` from `origin`: New.
    pub fn begin(
        &mut self,
        slot: ReqId,
        origin: &ReqOrigin,
        request: &proto::Request,
        stats: &mut StatsCollector,
        now: Nanos,
    ) -> &mut Req {
        let req = &mut self.reqs[slot.index()];
        req.reset(origin, request, now);
        stats.enter(ReqStage::New.stat());
        self.trace.record(now, slot, request.cookie, ReqStage::New);
        req
    }

    /// Request `id` is over (`Free`, its buffers gone): its slot goes back
    /// on the free list.
    pub fn free(&mut self, id: ReqId) {
        debug_assert_eq!(self.reqs[id.index()].state(), ReqStage::Free);
        self.reqs[id.index()].clear();
        self.free.push(id);
    }

    /// The connection that has waited longest for a slot, out of the line.
    pub fn next_waiter(&mut self) -> Option<ConnId> {
        self.waiters.pop_front()
    }

    /// `conn` no longer waits for a slot (its input ended, or it closed).
    pub fn forget_waiter(&mut self, conn: ConnId) {
        self.waiters.retain(|&w| w != conn);
    }

    pub fn set_state(&mut self, id: ReqId, to: ReqStage, stats: &mut StatsCollector, now: Nanos) {
        let req = &mut self.reqs[id.index()];
        // On in release builds too: a request past a broken arrow would
        // free or reuse memory the kernel may still write.
        if !arrow(req.state(), to) {
            broken_arrow(id, req.state(), to);
        }
        let (from, into) = (req.state().stat(), to.stat());
        if from != into {
            stats.transition(from, into);
        }
        req.enter(to);
        self.trace.record(now, id, req.cookie(), to);
    }

    /// The requests in flight that `q` names, oldest first, with their
    /// states; `conns` names their peers.
    pub fn trace(
        &self,
        q: TraceQuery,
        now: Nanos,
        reactor: usize,
        conns: &Conns,
    ) -> Vec<TracedReq> {
        let mut live: Vec<(ReqId, Nanos)> = (self.reqs.iter().enumerate())
            .filter(|(_, r)| r.state() != ReqStage::Free)
            .filter(|(_, r)| match q {
                TraceQuery::Conn(c) => r.conn().index == c,
                TraceQuery::Oldest(_) => true,
            })
            .map(|(i, r)| (ReqId(i as u32), r.t_start()))
            .collect();
        live.sort_by_key(|&(_, t)| t);
        if let TraceQuery::Oldest(n) = q {
            live.truncate(n);
        }
        live.into_iter()
            .map(|(id, _)| self.traced(id, now, reactor, conns))
            .collect()
    }

    fn traced(&self, id: ReqId, now: Nanos, reactor: usize, conns: &Conns) -> TracedReq {
        let r = &self.reqs[id.index()];
        let states = (self.trace.in_order())
            .filter(|e| e.req == id && e.cookie == r.cookie() && e.t >= r.t_start())
            .map(|e| TracedState {
                state: format!("{:?}", e.to),
                at_us: trace::us(e.t - r.t_start()),
            })
            .collect();
        TracedReq {
            reactor,
            conn: r.conn().index,
            peer: conns
                .get(r.conn())
                .map(|c| c.peer().to_string())
                .unwrap_or_default(),
            cookie: r.cookie(),
            command: format!("{:?}", r.command()),
            offset: r.offset(),
            len: r.span().max(u64::from(r.len())),
            state: format!("{:?}", r.state()),
            age_us: trace::us(now.saturating_sub(r.t_start())),
            states,
            cut: self.trace.since().is_some_and(|t| t > r.t_start()),
        }
    }

    pub fn set_piece(&mut self, id: ReqId, k: u32, to: PieceState) {
        use PieceState::*;
        let piece = self.reqs[id.index()].piece_mut(k);
        // On in release builds too, as a request's (`set_state`).
        assert!(
            matches!(
                (piece.state, to),
                (Idle, Pacing)
                    | (Pacing, NeedBuffer)
                    | (NeedBuffer, Filling | Device)
                    | (Filling, Device)
                    | (Device, Delayed | Ready | Done)
                    | (Delayed, Ready | Done)
                    | (Pacing | NeedBuffer | Filling | Ready, Done)
            ),
            "request {id:?} piece {k}: {:?} -> {to:?}",
            piece.state
        );
        piece.state = to;
    }

    /// READ IO `io` (whole, or a streamed READ's piece) sends `data`, a
    /// bdev's own memory, instead of its buffer (which it keeps until
    /// sent, as every READ does, so the pool's books do not change). False
    /// when it cannot.
    pub fn lend(&mut self, io: IoToken, data: libc::iovec) -> bool {
        let Some(req) = self.reqs.get_mut(io.req.index()) else {
            return false;
        };
        req.command() == proto::Command::Read && req.lend(io.part, data)
    }

    /// The IO `io` as submitted, for the driver to interpret its completion.
    pub fn io_request(&self, io: IoToken, buf_size: u32) -> Option<(u16, IoRequest)> {
        let req = self.reqs.get(io.req.index())?;
        let op = req.io_op()?;
        let piece = match io.part {
            Part::Whole => None,
            Part::Piece(k) => Some(k),
        };
        Some((req.export(), req.io_request(op, piece, buf_size)))
    }

    /// BLOCK_STATUS: one chunk per metadata context the client selected.
    pub fn answer_block_status(&mut self, id: ReqId, conns: &Conns, catalog: &Catalog) {
        let req = &self.reqs[id.index()];
        let export = &catalog.exports[req.export() as usize];
        let one = req.flags() & proto::CMD_FLAG_REQ_ONE != 0;
        let chunks: Vec<(u32, Vec<(u32, u32)>)> = match conns.get(req.conn()).map(|c| c.phase()) {
            Some(Phase::Transmission { meta, .. }) => meta
                .iter()
                .map(|(ctx, source)| {
                    let mut extents = source.extents(&export.bdev, req.offset(), req.len());
                    if one {
                        extents.truncate(1);
                    }
                    (*ctx, extents)
                })
                .collect(),
            _ => Vec::new(),
        };
        let req = &mut self.reqs[id.index()];
        if chunks.is_empty() || chunks.iter().any(|(_, e)| e.is_empty()) {
            req.set_error(proto::EINVAL);
        } else {
            req.block_status(&chunks);
        }
    }

    /// Released: a whole request takes its buffers (true), or queues for
    /// them in the pool.
    pub fn take_buffers(&mut self, id: ReqId, io: &mut IoPath) -> bool {
        let req = &mut self.reqs[id.index()];
        let (len, token) = (req.len(), IoToken::whole(id).encode());
        if !io.bufs_mut().alloc_into(len, token, req.bufs_mut()) {
            io.stats_mut().buffer_waits += 1;
            return false;
        }
        let pool = io.pool();
        req.lay_out_buffers(io.buf_size(), |b| pool.ptr(b));
        true
    }

    /// Request `id` holds `bufs`: its data segments point into them.
    pub fn attach(&mut self, id: ReqId, bufs: Vec<BufId>, io: &IoPath) {
        let pool = io.pool();
        self.reqs[id.index()].attach_buffers(bufs, io.buf_size(), |b| pool.ptr(b));
    }

    /// Request `id` commits its connection to the buffers it will hold
    /// (`IoPath::commitment`): the cap on one client's share of the pool.
    pub fn commit(&self, id: ReqId, conns: &mut Conns, io: &IoPath) {
        let req = &self.reqs[id.index()];
        let need = io.commitment(req);
        if let Some(c) = conns.get_mut(req.conn()) {
            c.commit(need);
        }
    }

    /// Ready: to the device, or answered here (BLOCK_STATUS, unknown).
    pub fn execute(&mut self, id: ReqId, conns: &Conns, io: &mut IoPath) -> Option<ReqStage> {
        let now = io.now();
        let req = &mut self.reqs[id.index()];
        let export = req.export();
        let Some(op) = req.io_op() else {
            if req.command() == Command::BlockStatus {
                self.answer_block_status(id, conns, io.catalog());
            } else {
                req.set_error(proto::EINVAL);
            }
            return Some(ReqStage::Answered);
        };
        req.submitted(now);
        if req.paced() && req.command() == Command::Write {
            // Its data is in: it goes to its device now (a READ is at its
            // device from its release).
            io.pacer_mut()
                .on_device_start(IoToken::whole(id).encode(), now);
        }
        let req = &self.reqs[id.index()];
        let request = req.io_request(op, None, io.buf_size());
        io.submit(IoToken::whole(id), export, request);
        Some(ReqStage::Device)
    }

    /// Executed: hold the completion for an emulated delay, or answer.
    pub fn executed(&mut self, id: ReqId, conns: &Conns, io: &mut IoPath) -> Option<ReqStage> {
        let req = &self.reqs[id.index()];
        let (export, t_submit) = (req.export(), req.t_submit());
        if let Some(t) = (req.io_op()).and_then(|op| io.delay_until(export, op, t_submit)) {
            let held = IoToken::whole(id);
            io.hold(t, held);
            return Some(ReqStage::Delayed);
        }
        io.device_finished(&self.reqs[id.index()], IoToken::whole(id));
        Some(self.piece_finished(id, conns))
    }

    /// A device IO of `id` is over (and its delay, if any): the next piece
    /// of a long TRIM, WRITE_ZEROES or CACHE goes to the device, unless a
    /// piece failed (the first error is the reply's) or the client is gone;
    /// anything else is answered.
    pub fn piece_finished(&mut self, id: ReqId, conns: &Conns) -> ReqStage {
        let conn = self.reqs[id.index()].conn();
        let open = conns.get(conn).is_some_and(|c| c.life() == Life::Open);
        let req = &mut self.reqs[id.index()];
        if req.error() == 0 && open && req.next_piece() {
            ReqStage::Ready
        } else {
            ReqStage::Answered
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each state's place in `STAGES`: a new state fails to compile here
    /// until it is listed there too.
    fn place(s: ReqStage) -> usize {
        use ReqStage::*;
        match s {
            Free => 0,
            New => 1,
            Deferred => 2,
            Pacing => 3,
            Released => 4,
            NeedBuffers => 5,
            Ready => 6,
            Device => 7,
            Executed => 8,
            Delayed => 9,
            Payload => 10,
            Receiving => 11,
            Streaming => 12,
            Dropping => 13,
            Answered => 14,
            Reply => 15,
            Sent => 16,
        }
    }

    #[test]
    fn the_arrow_table_is_the_diagram() {
        for (i, &s) in STAGES.iter().enumerate() {
            assert_eq!(place(s), i);
            assert!((s as usize) < 32);
        }
        for from in STAGES {
            for to in STAGES {
                assert_eq!(arrow(from, to), legal(from, to), "{from:?} -> {to:?}");
            }
        }
    }
}
