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

use super::ids::{IoToken, Part};
use super::slot::Req;
use super::Action;
use crate::exports::Catalog;
use crate::stats::StatsCollector;

pub struct IoPath {
    /// The reactor this engine serves, for logs.
    pub reactor: usize,
    pub catalog: Arc<Catalog>,
    pub pool: Arc<SharedPool>,
    pub buf_size: u32,
    pub bufs: ReactorBufs,
    pub pacer: Pacer,
    /// Completions held back by delay bdevs.
    pub delayed: BinaryHeap<Reverse<(Nanos, IoToken)>>,
    pub grants: Vec<(u64, Vec<BufId>)>,
    pub released: Vec<u64>,
    pub actions: Vec<Action>,
    pub rng: SmallRng,
    pub stats: StatsCollector,
    /// WRITE pieces one connection may have waiting for their payload at
    /// once, and buffers one streamed READ may hold at once.
    pub payload_cap: u32,
    /// This reactor's view of the exports' dirty bitmaps.
    pub dirty: bdev::dirty::DirtyMarks,
    pub now: Nanos,
    /// Connections an event touched: settled (parse, recv, close) before
    /// the event returns.
    pub touched: Vec<super::ids::ConnId>,
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
        if req.paced {
            self.bufs.buffers_for(req.len)
        } else if req.streamed() {
            self.stream_window()
        } else {
            (req.pieces.len() as u32).min(self.payload_cap)
        }
    }

    /// The pacer's view of `io` of `req`: its device, tenant, size and
    /// flow (its connection's).
    pub fn paced_io(&self, req: &Req, io: IoToken, flow: u64, kind: IoKind) -> PacedIo {
        let export = &self.catalog.exports[req.export as usize];
        let (offset, bytes) = match io.part {
            Part::Whole => (req.offset, req.len),
            Part::Piece(k) => (
                req.offset + u64::from(k) * u64::from(self.buf_size),
                req.piece_len(k, self.buf_size),
            ),
        };
        PacedIo {
            id: io.encode(),
            flow,
            device: export.device,
            tenant: export.tenant,
            bytes,
            kind,
            offset,
        }
    }

    /// The device (with its emulated delay) has finished `io`: its time at
    /// the device feeds the pacer's estimates and latency targets.
    pub fn device_finished(&mut self, req: &Req, io: IoToken) {
        let (kind, t_submit) = match io.part {
            Part::Whole if req.paced && req.command == Command::Write => {
                (IoKind::Write, req.t_submit)
            }
            Part::Whole if req.paced => (IoKind::Read, req.t_submit),
            Part::Whole => return,
            Part::Piece(k) if req.streamed() => (IoKind::Read, req.pieces[k as usize].t_submit),
            Part::Piece(k) => (IoKind::Write, req.pieces[k as usize].t_submit),
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
