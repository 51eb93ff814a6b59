//! The NVMe/TCP front end. Each connection's sans-IO queue
//! (`proto::nvme::queue`, in external mode) parses its PDUs; what the queue
//! cannot do itself comes here. Connect and admin commands go to the one
//! `Target` all reactors share (a lock taken only by the control path).
//! READs, WRITEs, Flush, Write Zeroes and deallocates become the engine's
//! requests and live its one life (pacer, pool, device, reply):
//!
//! - a READ is paced, takes its buffers, is read by the device and goes out
//!   as one C2HData PDU gathered from them, then its completion;
//! - a WRITE is paced whole; only once its buffers are its own does its R2T
//!   go out (or its in-capsule data land), so its data waits in the pacer,
//!   never in a socket holding a buffer; H2CData lands in the buffers;
//! - commands without data go to the device as NBD's do.
//!
//! A connection is a flow of the host its Connect names (its host NQN):
//! all the queues of one host share that host's link in the pacer.

use proto::nvme::ctrl::IoOp;
use proto::nvme::queue::{Action as QAction, DataStart, DevOp, Queue};
use proto::nvme::Status;
use proto::Command;

use super::conn::{EndReason, Input, Life, Phase, Step};
use super::ids::{ConnId, ReqId};
use super::nvme_conn::{NvmeConn, Waiting};
use super::slot::{ReplyStyle, ReqOrigin};
use super::states::ReqStage;
use super::Engine;

/// How often each engine checks its queues' controllers (keep-alive
/// expiry, resets, an admin queue gone), and takes their async events.
const CHECK_EVERY: pace::Nanos = 100_000_000;

/// The NVMe connection behind `c`, if it is one.
fn nvme_of(c: &mut super::conn::Conn) -> Option<&mut NvmeConn> {
    match &mut c.phase {
        Phase::Nvme(n) => Some(n),
        _ => None,
    }
}

/// A host id for the pacer from a host NQN: its queues share one host.
fn host_id(nqn: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    nqn.hash(&mut h);
    h.finish() | (1 << 63)
}

/// An NVMe status for a device error (an errno).
fn status_of(errno: u32) -> Status {
    match errno as i32 {
        libc::EPERM | libc::EROFS => Status::NAMESPACE_WRITE_PROTECTED,
        libc::ENOSPC => Status::generic(0x81), // capacity exceeded
        libc::EINVAL => Status::INVALID_FIELD,
        _ => Status::INTERNAL_ERROR,
    }
}

impl Engine {
    /// Feeds the connection's buffered bytes to its queue and carries out
    /// what the queue asks: every whole PDU is consumed at once.
    pub(super) fn nvme_input(&mut self, id: ConnId) -> Step {
        let Some(c) = self.conns.get_mut(id) else {
            return Step::Stop;
        };
        let (rstart, rend) = (c.rstart, c.rend);
        let super::conn::Conn { rbuf, phase, .. } = c;
        let Phase::Nvme(n) = phase else {
            return Step::Stop;
        };
        let (used, _) = n.queue.receive(&rbuf[rstart..rend]);
        // The data ranges point into the bytes just given: act on them
        // before those bytes are let go.
        self.nvme_actions(id);
        if let Some(c) = self.conns.get_mut(id) {
            c.rstart += used;
        }
        Step::Stop
    }

    /// Carries out the queue's actions until it asks for nothing more.
    fn nvme_actions(&mut self, id: ConnId) {
        loop {
            let actions = match self.conns.get_mut(id).and_then(nvme_of) {
                Some(n) => n.queue.take_actions(),
                None => return,
            };
            if actions.is_empty() {
                return;
            }
            for a in actions {
                self.nvme_act(id, a);
            }
        }
    }

    fn nvme_act(&mut self, id: ConnId, a: QAction) {
        match a {
            QAction::Connect { cid, sqe, data } => self.nvme_connect(id, cid, &sqe, &data),
            QAction::Admin { cid, cntlid, sqe } => {
                let now = self.io.now;
                let Some(t) = self.io.catalog.nvme.as_ref() else {
                    return;
                };
                let Ok(mut target) = t.target.lock() else {
                    return;
                };
                let d = target.admin(cntlid, &sqe, now);
                // Async Event Requests an Abort or a reset ended: they
                // were held by this queue, the controller's admin queue.
                let aers = target.take_events_of(cntlid);
                drop(target);
                if let Some(n) = self.conns.get_mut(id).and_then(nvme_of) {
                    n.queue.admin_done(cid, d);
                    for (aer, end) in aers {
                        n.queue.aer_end(aer, end);
                    }
                }
            }
            QAction::Admit { cid, write, .. } => self.nvme_wait(id, Waiting::Data { cid, write }),
            QAction::Io { cid, op, .. } => self.nvme_wait(id, Waiting::Op { cid, op }),
            QAction::Data {
                cid,
                datao,
                at,
                len,
            } => self.nvme_data(id, cid, datao, at, len),
            QAction::DataIn { cid, ok } => self.nvme_data_in(id, cid, ok),
            QAction::DropAer { cid, cntlid } => {
                if let Some(mut t) = self
                    .io
                    .catalog
                    .nvme
                    .as_ref()
                    .and_then(|t| t.target.lock().ok())
                {
                    t.drop_async_event(cntlid, cid);
                }
            }
            QAction::Close => {
                if let Some(c) = self.conns.get_mut(id) {
                    c.ending(EndReason::ProtocolError);
                }
                self.io.stats.protocol_errors += 1;
                self.input_ended(id);
            }
        }
    }

    /// Fabrics Connect: the target decides, with the export's allow rules
    /// for the host NQN; the connection becomes a flow of that host.
    fn nvme_connect(&mut self, id: ConnId, cid: u16, sqe: &proto::nvme::Sqe, data: &[u8]) {
        let now = self.io.now;
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let addr = c.peer.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
        let access = &self.io.catalog.access;
        let allowed = |i: usize, host: &str| {
            let client = crate::access::Client {
                addr,
                cert_name: None,
                hostnqn: Some(host.to_string()),
            };
            (access.exports.get(i)).map_or(proto::Access::ReadWrite, |(_, r)| r.access(&client))
        };
        let Some(t) = self.io.catalog.nvme.as_ref() else {
            return;
        };
        let Ok(mut target) = t.target.lock() else {
            return;
        };
        let r = target.connect_with(sqe, data, now, &allowed);
        let host = match &r {
            Ok(b) => target.controller(b.cntlid).map(|ct| host_id(&ct.hostnqn)),
            Err(_) => None,
        };
        drop(target);
        let peer = c.peer.clone();
        let flow = c.flow;
        let Some(n) = nvme_of(c) else { return };
        match &r {
            Ok(b) => {
                let export = b.subsys.and_then(|s| u16::try_from(s).ok());
                n.bound = Some((b.cntlid, b.qid, export));
                self.io.pacer.open_flow(flow, host.unwrap_or(flow));
                tracing::info!(reactor = self.id, peer = %peer, cntlid = b.cntlid, qid = b.qid, "nvme/tcp: connected");
            }
            Err((s, dw0)) => {
                tracing::info!(reactor = self.id, peer = %peer, status = ?s, dw0, "nvme/tcp: connect refused");
            }
        }
        n.queue.connected(cid, r);
    }

    /// A command that needs a request slot: it starts now, or waits its turn.
    fn nvme_wait(&mut self, id: ConnId, w: Waiting) {
        if let Some(n) = self.conns.get_mut(id).and_then(nvme_of) {
            n.waiting.push_back(w);
        }
        self.nvme_start_waiting(id);
    }

    /// Starts waiting commands while a slot is free and the connection's
    /// requests hold less than its share of the pool.
    fn nvme_start_waiting(&mut self, id: ConnId) {
        loop {
            let cap = self.conn_cap;
            let Some(c) = self.conns.get_mut(id) else {
                return;
            };
            if c.life != Life::Open || c.committed >= cap {
                return;
            }
            let Some(n) = nvme_of(c) else { return };
            if n.waiting.is_empty() {
                return;
            }
            let Some(slot) = self.slots.free.pop() else {
                if !self.slots.waiters.contains(&id) {
                    self.slots.waiters.push_back(id);
                }
                return;
            };
            let Some(w) = n.waiting.pop_front() else {
                self.slots.free.push(slot);
                return;
            };
            self.nvme_request(id, slot, w);
        }
    }

    /// Command `w` takes request `slot` and starts its life.
    fn nvme_request(&mut self, id: ConnId, slot: ReqId, w: Waiting) {
        let now = self.io.now;
        let Some(c) = self.conns.get_mut(id) else {
            self.slots.free.push(slot);
            return;
        };
        let Some(n) = nvme_of(c) else {
            self.slots.free.push(slot);
            return;
        };
        let (cid, request, ranges) = match nvme_command(&n.queue, w) {
            Some(r) => r,
            None => {
                // The queue forgot it (closing): nothing to serve.
                self.slots.free.push(slot);
                return;
            }
        };
        let export = n.export().unwrap_or(0);
        n.slots.insert(cid, slot);
        c.requests += 1;
        let origin = ReqOrigin {
            conn: id,
            export,
            style: ReplyStyle::Nvme,
        };
        let req = &mut self.slots.reqs[slot.index()];
        req.reset(&origin, &request, now);
        req.ranges = ranges;
        self.io.stats.enter(ReqStage::New.stat());
        self.slots
            .trace
            .record(now, slot, u64::from(cid), ReqStage::New);
        self.advance(slot);
    }

    /// A WRITE holds its buffers: its in-capsule data lands in them, or
    /// its R2T goes out.
    pub(super) fn nvme_data_wanted(&mut self, id: ReqId) -> ReqStage {
        let req = &self.slots.reqs[id.index()];
        let (conn, cid) = (req.conn, req.cookie as u16);
        let Some(c) = self.conns.get_mut(conn) else {
            return ReqStage::Answered;
        };
        if c.input != Input::Pdus {
            // Input ended: no data will come.
            self.slots.reqs[id.index()].fault = Some(Status::ABORTED_SQ_DELETED);
            return ReqStage::Answered;
        }
        let Some(n) = nvme_of(c) else {
            return ReqStage::Answered;
        };
        match n.queue.request_data(cid) {
            DataStart::InCapsule(data) => {
                let req = &mut self.slots.reqs[id.index()];
                if copy_into(&req.iov, 0, &data) {
                    req.filled = data.len() as u32;
                    ReqStage::Ready
                } else {
                    req.fault = Some(Status::DATA_SGL_LENGTH_INVALID);
                    ReqStage::Answered
                }
            }
            DataStart::Requested => {
                // The R2T is in the queue's output.
                self.io.touched.push(conn);
                ReqStage::Receiving
            }
            DataStart::Gone => {
                self.slots.reqs[id.index()].fault = Some(Status::ABORTED_SQ_DELETED);
                ReqStage::Answered
            }
        }
    }

    /// H2CData bytes for `cid` at `at` of the bytes given to the queue.
    fn nvme_data(&mut self, id: ConnId, cid: u16, datao: u32, at: usize, len: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let Some(&slot) = nvme_of(c).and_then(|n| n.slots.get(&cid)) else {
            return;
        };
        let from = c.rstart + at;
        let Some(src) = c.rbuf.get(from..from + len as usize) else {
            return;
        };
        let req = &mut self.slots.reqs[slot.index()];
        if req.state != ReqStage::Receiving {
            return;
        }
        if copy_into(&req.iov, datao as usize, src) {
            req.filled += len;
        }
    }

    /// A WRITE's data is all in: to the device (or answered, when a data
    /// digest failed).
    fn nvme_data_in(&mut self, id: ConnId, cid: u16, ok: bool) {
        let Some(&slot) = self
            .conns
            .get_mut(id)
            .and_then(nvme_of)
            .and_then(|n| n.slots.get(&cid))
        else {
            return;
        };
        let req = &mut self.slots.reqs[slot.index()];
        if req.state != ReqStage::Receiving {
            return;
        }
        let next = if !ok {
            req.fault = Some(Status::TRANSIENT_TRANSPORT_ERROR);
            ReqStage::Answered
        } else if req.filled == req.len {
            ReqStage::Ready
        } else {
            req.fault = Some(Status::DATA_SGL_LENGTH_INVALID);
            ReqStage::Answered
        };
        self.set_state(slot, next);
        self.advance(slot);
    }

    /// READ `id`'s reply carries a data digest, computed before the send:
    /// bytes lent from a RAM bdev that a WRITE changed in between failed
    /// it at the host (SPDK perf, randrw with -H -I), so such a READ is
    /// copied into its buffers instead.
    pub(super) fn digests_read_data(&mut self, id: ReqId) -> bool {
        let Some(conn) = self.slots.reqs.get(id.index()).map(|r| r.conn) else {
            return false;
        };
        self.conns
            .get_mut(conn)
            .and_then(nvme_of)
            .is_some_and(|n| n.queue.data_digest())
    }

    /// Encodes an answered request's reply: a READ's C2HData head before
    /// its data, then its data digest and completion.
    pub(super) fn nvme_reply(&mut self, id: ReqId) {
        let req = &mut self.slots.reqs[id.index()];
        let (conn, cid) = (req.conn, req.cookie as u16);
        let status = match (req.fault, req.error) {
            (Some(s), _) => s,
            (None, 0) => Status::SUCCESS,
            (None, e) => status_of(e),
        };
        req.hdr.clear();
        req.trailer.clear();
        let Some(n) = self.conns.get_mut(conn).and_then(nvme_of) else {
            return;
        };
        n.slots.remove(&cid);
        if req.command == Command::Read && status.is_success() && req.len > 0 {
            // The data PDU completes it (SUCCESS flag, as SPDK's target
            // sends by default): no CapsuleResp follows.
            n.queue.c2h_head(cid, req.len, true, &mut req.hdr);
            req.data_reply = true;
            if n.queue.data_digest() {
                let crc = req.iov.iter().fold(0u32, |crc, v| {
                    // SAFETY: the iovecs cover the READ's data, in buffers
                    // (or a bdev's memory) it holds until its reply is sent.
                    let b =
                        unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
                    proto::nvme::pdu::crc32c_append(crc, b)
                });
                req.trailer.extend_from_slice(&crc.to_le_bytes());
            }
            n.queue.finish_silently(cid);
        } else {
            n.queue.finish_external(cid, status, &mut req.hdr);
        }
    }

    /// No more bytes come: WRITEs waiting for their data never get it.
    pub(super) fn nvme_input_ended(&mut self, id: ConnId) {
        let Some(n) = self.conns.get_mut(id).and_then(nvme_of) else {
            return;
        };
        let slots: Vec<ReqId> = n.slots.values().copied().collect();
        for r in slots {
            if self.slots.reqs[r.index()].state == ReqStage::Receiving {
                self.abort(r);
            }
        }
    }

    /// After an event: waiting commands start, and what the queue wrote
    /// (ICResp, R2Ts, admin completions) goes out.
    pub(super) fn nvme_settle(&mut self, id: ConnId) {
        self.nvme_start_waiting(id);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let super::conn::Conn { out, phase, .. } = c;
        let Phase::Nvme(n) = phase else { return };
        if n.queue.has_output() {
            out.raw.extend_from_slice(&n.queue.take_output());
            self.conns.mark_send(id);
        }
    }

    /// The connection closed: its queue leaves its controller, its waiting
    /// commands are dropped (those with slots were aborted by `close`).
    pub(super) fn nvme_closed(&mut self, id: ConnId) {
        let Some(n) = self.conns.get_mut(id).and_then(nvme_of) else {
            return;
        };
        n.queue.abort_all();
        n.waiting.clear();
        n.slots.clear();
        let bound = n.bound.take();
        self.slots.waiters.retain(|&w| w != id);
        if let (Some((cntlid, qid, _)), Some(t)) = (bound, self.io.catalog.nvme.as_ref()) {
            if let Ok(mut target) = t.target.lock() {
                target.queue_closed(cntlid, qid);
            }
        }
    }

    /// Every `CHECK_EVERY`: the controllers' keep-alive timers run, and
    /// queues whose controller (or IO queue) is gone close.
    pub(super) fn nvme_tick(&mut self) {
        if self.nvme_conns == 0 || self.io.now < self.nvme_check_at {
            return;
        }
        self.nvme_check_at = self.io.now + CHECK_EVERY;
        let Some(t) = self.io.catalog.nvme.clone() else {
            return;
        };
        let Ok(mut target) = t.target.lock() else {
            return;
        };
        target.tick(self.io.now);
        // Each engine checks its own queues below; the list is not needed.
        target.take_dropped();
        let mut gone = Vec::new();
        for c in self.conns.iter_mut() {
            let Phase::Nvme(n) = &c.phase else { continue };
            match n.bound {
                Some((cntlid, qid, _)) if !target.queue_live(cntlid, qid) => {
                    gone.push((c.id, cntlid))
                }
                _ => {}
            }
        }
        drop(target);
        for (id, cntlid) in gone {
            tracing::info!(
                reactor = self.id,
                cntlid,
                conn = id.index,
                "nvme/tcp: controller gone, closing its queue"
            );
            if let Some(c) = self.conns.get_mut(id) {
                c.ending(EndReason::ControllerGone);
            }
            self.close(id);
        }
        self.settle();
    }

    /// When `nvme_tick` next has work.
    pub(super) fn nvme_deadline(&self) -> Option<pace::Nanos> {
        (self.nvme_conns > 0).then_some(self.nvme_check_at)
    }

    /// A connection of this engine opened (true) or went (false).
    pub(super) fn nvme_count(&mut self, opened: bool) {
        if opened {
            if self.nvme_conns == 0 {
                self.nvme_check_at = self.io.now + CHECK_EVERY;
            }
            self.nvme_conns += 1;
        } else {
            debug_assert!(self.nvme_conns > 0);
            self.nvme_conns -= 1;
        }
    }
}

/// A command id, its request, and further byte ranges (`nvme_command`).
type NvmeRequest = (u16, proto::Request, Vec<(u64, u64)>);

/// The engine's request for a waiting command: its id, an NBD-shaped
/// request (the command, flags, byte offset and length) and any further
/// byte ranges (a deallocate's). None when the queue no longer has it.
fn nvme_command(q: &Queue, w: Waiting) -> Option<NvmeRequest> {
    let request = |cid: u16, command, flags, offset, length| proto::Request {
        flags,
        command,
        cookie: u64::from(cid),
        offset,
        length,
    };
    match w {
        Waiting::Data { cid, write } => {
            let io = q.io_cmd(cid)?;
            debug_assert_eq!(write, io.op == IoOp::Write);
            let (command, fua) = match io.op {
                IoOp::Write => (Command::Write, io.fua),
                _ => (Command::Read, false),
            };
            let flags = if fua { proto::CMD_FLAG_FUA } else { 0 };
            Some((
                cid,
                request(cid, command, flags, io.offset, u64::from(io.xfer)),
                Vec::new(),
            ))
        }
        Waiting::Op { cid, op } => Some(match op {
            DevOp::Flush => (cid, request(cid, Command::Flush, 0, 0, 0), Vec::new()),
            DevOp::WriteZeroes { offset, len } => {
                let flags = proto::CMD_FLAG_NO_HOLE;
                (
                    cid,
                    request(cid, Command::WriteZeroes, flags, offset, len),
                    Vec::new(),
                )
            }
            DevOp::Trim { mut ranges } => {
                ranges.reverse();
                let (offset, len) = ranges.pop().unwrap_or((0, 0));
                (cid, request(cid, Command::Trim, 0, offset, len), ranges)
            }
            // READs and WRITEs of an external queue ask for admission.
            DevOp::Read { .. } | DevOp::Write { .. } => return None,
        }),
    }
}

/// Copies `src` into the buffers `iov` lays out, from byte `at` of them;
/// false (nothing copied) when it does not fit.
fn copy_into(iov: &[libc::iovec], mut at: usize, mut src: &[u8]) -> bool {
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    if at + src.len() > total {
        return false;
    }
    for v in iov {
        if src.is_empty() {
            break;
        }
        if at >= v.iov_len {
            at -= v.iov_len;
            continue;
        }
        let n = src.len().min(v.iov_len - at);
        // SAFETY: at + n <= iov_len: inside a buffer the request holds.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), v.iov_base.cast::<u8>().add(at), n);
        }
        src = &src[n..];
        at = 0;
    }
    true
}
