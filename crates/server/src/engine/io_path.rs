//! The path below the requests, which every part of the engine uses: the
//! engine's clock, the pacer, the buffer pool, the devices (submission,
//! emulated delays, dirty marks), the statistics, and the actions the
//! driver carries out.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use bdev::IoRequest;
use pace::pacer::{IoKind, PacedIo, Pacer};
use pace::Nanos;
use pool::{BufId, ReactorBufs, SharedPool};
use proto::Command;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::ids::{ConnId, IoToken, Part};
use super::slot::Req;
use super::Action;
use crate::exports::Catalog;
use crate::stats::StatsCollector;

pub struct IoPath {
    /// The reactor this engine serves, for logs.
    reactor: usize,
    catalog: Arc<Catalog>,
    pool: Arc<SharedPool>,
    buf_size: u32,
    bufs: ReactorBufs,
    pacer: Pacer,
    /// Completions held back by delay bdevs.
    delayed: BinaryHeap<Reverse<(Nanos, IoToken)>>,
    grants: Vec<(u64, Vec<BufId>)>,
    released: Vec<u64>,
    actions: Vec<Action>,
    rng: SmallRng,
    stats: StatsCollector,
    /// WRITE pieces one connection may have waiting for their payload at
    /// once, and buffers one streamed READ may hold at once.
    payload_cap: u32,
    /// This reactor's view of the exports' dirty bitmaps.
    dirty: bdev::dirty::DirtyMarks,
    now: Nanos,
    /// Connections an event touched: settled (parse, recv, close) before
    /// the event returns.
    touched: Vec<ConnId>,
}

/// What the request machine and the front ends ask of the IO path: its
/// clock, the services it holds (pacer, buffers, statistics, exports), the
/// connections an event touched, the driver's actions, and the IOs an
/// emulated delay holds back.
impl IoPath {
    readers!(now: Nanos, reactor: usize, buf_size: u32, payload_cap: u32;);

    /// The driver's clock at an event. It never goes back, so the engine's
    /// time differences are exact.
    pub fn set_now(&mut self, now: Nanos) {
        debug_assert!(now >= self.now, "time went back: {} -> {now}", self.now);
        self.now = now;
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn pool(&self) -> &Arc<SharedPool> {
        &self.pool
    }

    pub fn pacer(&self) -> &Pacer {
        &self.pacer
    }

    pub fn pacer_mut(&mut self) -> &mut Pacer {
        &mut self.pacer
    }

    pub fn bufs(&self) -> &ReactorBufs {
        &self.bufs
    }

    pub fn bufs_mut(&mut self) -> &mut ReactorBufs {
        &mut self.bufs
    }

    pub fn stats(&self) -> &StatsCollector {
        &self.stats
    }

    pub fn stats_mut(&mut self) -> &mut StatsCollector {
        &mut self.stats
    }

    /// An event touched connection `id`: it is settled before the event
    /// returns.
    pub fn touch(&mut self, id: ConnId) {
        self.touched.push(id);
    }

    /// The next touched connection to settle.
    pub fn next_touched(&mut self) -> Option<ConnId> {
        self.touched.pop()
    }

    pub fn all_settled(&self) -> bool {
        self.touched.is_empty()
    }

    /// An action for the driver.
    pub fn act(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Moves the actions produced so far into `out`, an empty list the
    /// driver lends (a swap: anything in it would be sent again).
    pub fn take_actions(&mut self, out: &mut Vec<Action>) {
        debug_assert!(out.is_empty(), "{} actions not yet carried out", out.len());
        std::mem::swap(&mut self.actions, out);
    }

    /// An emulated delay holds `io`'s completion back until `t`.
    pub fn hold(&mut self, t: Nanos, io: IoToken) {
        self.delayed.push(Reverse((t, io)));
    }

    /// When the first held completion is due.
    pub fn next_held(&self) -> Option<Nanos> {
        self.delayed.peek().map(|Reverse((t, _))| *t)
    }

    /// Completions held back.
    pub fn held(&self) -> usize {
        self.delayed.len()
    }

    /// The next held completion whose time has come, let go.
    pub fn due_held(&mut self) -> Option<IoToken> {
        let Reverse((t, io)) = self.delayed.peek().copied()?;
        if t > self.now {
            return None;
        }
        self.delayed.pop();
        Some(io)
    }

    /// The IOs the pacer releases now (in a reused list: hand it back
    /// with `releases_done`).
    pub fn pacer_releases(&mut self) -> Vec<u64> {
        self.pacer.poll(self.now, &mut self.released);
        std::mem::take(&mut self.released)
    }

    pub fn releases_done(&mut self, mut released: Vec<u64>) {
        released.clear();
        self.released = released;
    }

    /// Buffers the pool granted to requests that queued for them.
    pub fn buffer_grants(&mut self) -> Vec<(u64, Vec<BufId>)> {
        self.bufs.poll(&mut self.grants);
        std::mem::take(&mut self.grants)
    }
}

impl IoPath {
    pub fn new(
        id: usize,
        catalog: Arc<Catalog>,
        bufs: ReactorBufs,
        pacer: Pacer,
        payload_cap: u32,
        now: Nanos,
    ) -> IoPath {
        let pool = bufs.pool().clone();
        let stats = StatsCollector::new(id, &catalog);
        IoPath {
            reactor: id,
            catalog,
            buf_size: pool.buffer_size(),
            pool,
            bufs,
            pacer,
            delayed: BinaryHeap::new(),
            grants: Vec::new(),
            released: Vec::new(),
            actions: Vec::new(),
            rng: SmallRng::seed_from_u64(0x10_9ace ^ id as u64),
            stats,
            payload_cap: payload_cap.max(1),
            dirty: bdev::dirty::DirtyMarks::default(),
            now,
            touched: Vec::new(),
        }
    }

    /// Hands a device IO to the driver. A WRITE, WRITE_ZEROES or TRIM
    /// marks its export's dirty bitmaps first, before its data can change
    /// (and again at completion, see `io_done`), so a write that fails or
    /// races a clear never loses a change.
    pub fn submit(&mut self, io: IoToken, export: u16, req: IoRequest) {
        if req.op.is_write() {
            self.mark_dirty(export, &req);
        }
        self.actions.push(Action::Submit { io, export, req });
    }

    pub fn mark_dirty(&mut self, export: u16, req: &IoRequest) {
        let set = &self.catalog.exports[export as usize].dirty;
        (self.dirty).mark(export as usize, set, req.offset, u64::from(req.len));
    }

    /// A READ of `len` bytes streams when it needs more buffers than a
    /// stream's window.
    pub fn streams(&self, len: u32) -> bool {
        self.bufs.buffers_for(len) > self.stream_window()
    }

    /// Pieces a streamed READ has live at most: `payload_cap`, or the whole
    /// pool when that is smaller.
    pub fn stream_window(&self) -> u32 {
        self.payload_cap.min(self.pool.large_buffers())
    }

    /// Buffers a request commits its connection to: a READ's whole length,
    /// a streamed READ's window, a WRITE's pieces held at once.
    pub fn commitment(&self, req: &Req) -> u32 {
        if req.paced() {
            self.bufs.buffers_for(req.len())
        } else if req.streamed() {
            self.stream_window()
        } else {
            (req.pieces().len() as u32).min(self.payload_cap)
        }
    }

    /// The pacer's view of `io` of `req`: its device, tenant, size and
    /// flow (its connection's).
    pub fn paced_io(&self, req: &Req, io: IoToken, flow: u64, kind: IoKind) -> PacedIo {
        let export = &self.catalog.exports[req.export() as usize];
        let (offset, bytes) = match io.part {
            Part::Whole => (req.offset(), req.len()),
            Part::Piece(k) => (
                req.offset() + u64::from(k) * u64::from(self.buf_size),
                req.piece_len(k, self.buf_size),
            ),
        };
        PacedIo {
            id: io.encode(),
            flow,
            device: export.device,
            tenant: export.tenant,
            bytes,
            request: req.len(),
            kind,
            offset,
        }
    }

    /// The device (with its emulated delay) has finished `io`: its time at
    /// the device feeds the pacer's estimates and latency targets.
    pub fn device_finished(&mut self, req: &Req, io: IoToken) {
        let (kind, t_submit) = match io.part {
            Part::Whole if req.paced() && req.command() == Command::Write => {
                (IoKind::Write, req.t_submit())
            }
            Part::Whole if req.paced() => (IoKind::Read, req.t_submit()),
            Part::Whole => return,
            Part::Piece(k) if req.streamed() => (IoKind::Read, req.pieces()[k as usize].t_submit),
            Part::Piece(k) => (IoKind::Write, req.pieces()[k as usize].t_submit),
        };
        let latency = self.now - t_submit;
        self.pacer
            .on_device_complete(io.encode(), kind, latency, self.now);
    }

    /// When an emulated delay (a delay bdev's) releases an IO of `export`
    /// submitted at `t_submit`, if that is still to come.
    pub fn delay_until(&mut self, export: u16, op: bdev::IoOp, t_submit: Nanos) -> Option<Nanos> {
        let dev = &self.catalog.exports[export as usize].bdev;
        if !dev.has_delay() {
            return None;
        }
        let release = dev.release_at(op, t_submit, self.now, &mut self.rng);
        (release > self.now).then_some(release)
    }
}
