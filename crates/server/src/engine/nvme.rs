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

use proto::nvme::ctrl::{AdminDone, IoAbort};
use proto::nvme::queue::Action as QAction;
use proto::nvme::{Sqe, Status};
use proto::Command;

use super::conn::Conn;
use super::conn_state::{EndReason, Life, Phase, Step};
use super::conns::Conns;
use super::framing::ReplyStyle;
use super::framing::ReqOrigin;
use super::ids::{ConnId, ReqId};
use super::io_path::IoPath;
use super::nvme_conn::{Connect, Waiting, QID_IN_USE, QID_RECHECK, QID_WAIT};
use super::nvme_data::{data, data_in, nvme_command, nvme_of, wait, Next};
use super::request::Requests;
use super::slots::Slots;
use super::states::ReqStage;

/// How often each engine checks its queues' controllers (keep-alive
/// expiry, resets, an admin queue gone), and takes their async events.
const CHECK_EVERY: pace::Nanos = 100_000_000;

/// An admin command goes to the target; its answer, and the Async Event
/// Requests an Abort or a reset ended (held by this queue, the
/// controller's admin queue), come back to the queue.
fn admin(id: ConnId, cid: u16, cntlid: u16, sqe: &Sqe, conns: &mut Conns, io: &IoPath) {
    let now = io.now();
    let Some(t) = io.catalog().nvme.as_ref() else {
        return;
    };
    let Some((d, aers)) = t.with(|target| {
        (
            target.admin(cntlid, sqe, now),
            target.take_events_of(cntlid),
        )
    }) else {
        return;
    };
    if let Some(n) = conns.get_mut(id).and_then(nvme_of) {
        n.queue_mut().admin_done(cid, d);
        for (aer, end) in aers {
            n.queue_mut().aer_end(aer, end);
        }
    }
}

/// A host id for the pacer from a host NQN: its queues share one host.
fn host_id(nqn: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    nqn.hash(&mut h);
    h.finish() | (1 << 63)
}

/// The NVMe/TCP front end of one engine: its connections' count and when
/// their controllers are next checked. The per-connection state is each
/// connection's `NvmeConn` (`Phase::Nvme`). The front end drives the
/// request machine (`Requests`, over the engine's parts): a queue's action
/// that leaves work to it comes back as a [`Next`], which `input` carries
/// out; the machine's calls into NVMe/TCP are `nvme_data.rs`'s.
pub struct NvmeFront {
    reactor: usize,
    /// NVMe/TCP connections open, and when their controllers are next checked.
    open: u32,
    check_at: pace::Nanos,
    /// The target's mail count last looked at (`NvmeTarget::mail`).
    mail_seen: u64,
    /// The list a queue's actions are moved into (`input`), kept for its
    /// capacity.
    actions: Vec<QAction>,
}

/// What the target holds for this engine's queues (`NvmeFront::take_mail`).
#[derive(Default)]
pub struct Mail {
    /// Parked admin commands ended, for admin queues: (queue, cid, completion).
    pub done: Vec<(ConnId, u16, Option<AdminDone>)>,
    /// Aborts of commands on IO queues.
    pub aborts: Vec<(ConnId, IoAbort)>,
}

/// Where an Abort found its IO command (`NvmeFront::find`).
pub enum Found {
    /// Waiting for a request slot: completed as aborted, now.
    Aborted,
    /// Holding request slot `ReqId`.
    Slot(ReqId),
    /// Not here (completed, or never came).
    Missing,
}

impl NvmeFront {
    pub fn new(reactor: usize) -> NvmeFront {
        NvmeFront {
            reactor,
            open: 0,
            check_at: 0,
            mail_seen: 0,
            actions: Vec::new(),
        }
    }

    /// Moves the actions the connection's queue asks for into `out`
    /// (empty); false when there are none, or the connection is gone.
    fn take_actions(c: Option<&mut Conn>, out: &mut Vec<QAction>) -> bool {
        let Some(n) = c.and_then(nvme_of) else {
            return false;
        };
        n.queue_mut().move_actions(out);
        !out.is_empty()
    }

    /// Feeds the connection's buffered bytes to its NVMe/TCP queue and
    /// carries out what the queue asks: every whole PDU is consumed at
    /// once. `cap` is a connection's share of the pool (`start_waiting`).
    pub fn input(&mut self, id: ConnId, cap: u32, r: &mut Requests) -> Step {
        let Some(used) = r.conn(id).and_then(Conn::nvme_receive) else {
            return Step::Stop;
        };
        // The data ranges point into the bytes just given: act on them
        // before those bytes are let go.
        let mut actions = std::mem::take(&mut self.actions);
        while Self::take_actions(r.conn(id), &mut actions) {
            for a in actions.drain(..) {
                let (slots, conns, io) = r.parts();
                match self.act(id, a, conns, slots, io) {
                    Next::Done => {}
                    Next::StartWaiting => Self::start_waiting(id, cap, r),
                    Next::Advance(slot) => r.advance(slot),
                    Next::InputEnded => r.input_ended(id),
                }
            }
        }
        self.actions = actions;
        if let Some(c) = r.conn(id) {
            c.consume(used);
        }
        Step::Stop
    }

    /// Carries out one of the queue's actions.
    pub fn act(
        &mut self,
        id: ConnId,
        a: QAction,
        conns: &mut Conns,
        slots: &mut Slots,
        io: &mut IoPath,
    ) -> Next {
        match a {
            QAction::Connect { cid, sqe, data } => {
                let since = io.now();
                self.connect(
                    id,
                    Connect {
                        since,
                        cid,
                        sqe,
                        data,
                    },
                    conns,
                    io,
                )
            }
            QAction::Admin { cid, cntlid, sqe } => admin(id, cid, cntlid, &sqe, conns, io),
            QAction::Admit { cid, write, .. } => {
                return wait(id, Waiting::Data { cid, write }, conns)
            }
            QAction::Io { cid, op, .. } => return wait(id, Waiting::Op { cid, op }, conns),
            QAction::Data {
                cid,
                datao,
                at,
                len,
            } => data(id, cid, datao, at, len, conns, slots),
            QAction::DataIn { cid, ok } => return data_in(id, cid, ok, conns, slots, io),
            QAction::DropAer { cid, cntlid } => {
                if let Some(t) = io.catalog().nvme.as_ref() {
                    t.with(|t| t.drop_async_event(cntlid, cid));
                }
            }
            QAction::Close => {
                if let Some(c) = conns.get_mut(id) {
                    c.ending(EndReason::ProtocolError);
                }
                io.stats_mut().protocol_errors += 1;
                return Next::InputEnded;
            }
        }
        Next::Done
    }

    /// Fabrics Connect: the target decides, with the export's allow rules
    /// for the host NQN; the connection becomes a flow of that host. An
    /// I/O queue's QID in use is checked again until `QID_WAIT` after the
    /// Connect came.
    fn connect(&mut self, id: ConnId, cmd: Connect, conns: &mut Conns, io: &mut IoPath) {
        let now = io.now();
        let Some(c) = conns.get_mut(id) else {
            return;
        };
        let addr = c
            .peer()
            .parse::<std::net::SocketAddr>()
            .ok()
            .map(|a| a.ip());
        let access = &io.catalog().access;
        let allowed = |i: usize, host: &str| {
            let client = crate::access::Client {
                addr,
                cert_name: None,
                hostnqn: Some(host.to_string()),
            };
            (access.exports.get(i)).map_or(proto::Access::ReadWrite, |(_, r)| r.access(&client))
        };
        let Some(t) = io.catalog().nvme.as_ref() else {
            return;
        };
        let Ok(mut target) = t.target.lock() else {
            return;
        };
        let r = target.connect_with(&cmd.sqe, &cmd.data, now, &allowed);
        let host = match &r {
            Ok(b) => target.controller(b.cntlid).map(|ct| host_id(&ct.hostnqn)),
            Err(_) => None,
        };
        drop(target);
        let peer: Box<str> = c.peer().into();
        let flow = c.flow();
        let Some(n) = nvme_of(c) else { return };
        let io_queue = cmd.sqe.cdw(10) >> 16 != 0;
        if io_queue && now < cmd.since + QID_WAIT && matches!(r, Err((_, QID_IN_USE))) {
            n.recheck_later(cmd);
            self.check_at = self.check_at.min(now + QID_RECHECK);
            return;
        }
        match &r {
            Ok(b) => {
                let export = b.subsys.and_then(|s| u16::try_from(s).ok());
                n.bind(b.cntlid, b.qid, export);
                io.pacer_mut().open_flow(flow, host.unwrap_or(flow));
                tracing::info!(reactor = self.reactor, peer = %peer, cntlid = b.cntlid, qid = b.qid, "nvme/tcp: connected");
            }
            Err((s, dw0)) => {
                tracing::info!(reactor = self.reactor, peer = %peer, status = ?s, dw0, "nvme/tcp: connect refused");
            }
        }
        n.queue_mut().connected(cmd.cid, r);
    }

    /// Connects whose QID was in use are decided again: the old queue's
    /// close came meanwhile, or they wait on (refused after `QID_WAIT`).
    fn rechecks(&mut self, conns: &mut Conns, io: &mut IoPath) {
        let mut due = Vec::new();
        for c in conns.iter_mut() {
            let (id, open) = (c.id(), c.life() == Life::Open);
            let Phase::Nvme(n) = c.phase_mut() else {
                continue;
            };
            if open {
                if let Some(cmd) = n.take_recheck() {
                    due.push((id, cmd));
                }
            }
        }
        for (id, cmd) in due {
            self.connect(id, cmd, conns, io);
            io.touch(id);
        }
    }

    /// The next waiting command's request, given a slot, if a slot is free
    /// and the connection's requests hold less than `cap`, its share of the
    /// pool. One at a time: the engine advances it (which commits its
    /// buffers) before it asks for the next.
    fn start_next(id: ConnId, cap: u32, r: &mut Requests) -> Option<ReqId> {
        let (slots, conns, io) = r.parts();
        loop {
            let c = conns.get_mut(id)?;
            if c.life() != Life::Open || c.committed() >= cap {
                return None;
            }
            let n = nvme_of(c)?;
            if !n.has_waiting() {
                return None;
            }
            if !slots.has_free() {
                slots.wait_for_slot(id);
                return None;
            }
            let w = n.next_waiting()?;
            // None: the queue forgot it (closing), nothing to serve.
            let Some((cid, request, ranges)) = nvme_command(n.queue(), w) else {
                continue;
            };
            let slot = slots.claim()?;
            let export = n.export().unwrap_or(0);
            n.slots_mut()
                .insert(cid, slot, request.command == Command::Write);
            c.request_began();
            let origin = ReqOrigin {
                conn: id,
                export,
                style: ReplyStyle::Nvme,
            };
            let now = io.now();
            let req = slots.begin(slot, &origin, &request, io.stats_mut(), now);
            req.set_ranges(ranges);
            return Some(slot);
        }
    }

    /// Starts waiting commands, one at a time, while a slot is free and
    /// the connection's requests hold less than `cap`, its share of the
    /// pool.
    pub fn start_waiting(id: ConnId, cap: u32, r: &mut Requests) {
        while let Some(slot) = Self::start_next(id, cap, r) {
            r.advance(slot);
        }
    }

    /// What the target holds for this engine's queues, once its mail
    /// count moved: the ends of parked admin commands for its admin
    /// queues, the Aborts of commands on its IO queues.
    pub fn take_mail(&mut self, conns: &mut Conns, io: &IoPath) -> Option<Mail> {
        let t = io.catalog().nvme.as_ref().filter(|_| self.open > 0)?;
        let seen = t.mail();
        if seen == self.mail_seen {
            return None;
        }
        self.mail_seen = seen;
        let mut target = t.target.lock().ok()?;
        let mut mail = Mail::default();
        for c in conns.iter_mut() {
            let Phase::Nvme(n) = &c.phase() else { continue };
            match n.bound() {
                Some((cntlid, 0, _)) => {
                    let done = target.take_events_of(cntlid).into_iter();
                    mail.done.extend(done.map(|(cid, d)| (c.id(), cid, d)));
                }
                Some((cntlid, qid, _)) => {
                    let aborts = target.take_io_aborts_of(cntlid, qid).into_iter();
                    mail.aborts.extend(aborts.map(|a| (c.id(), a)));
                }
                None => {}
            }
        }
        Some(mail)
    }

    /// The target's mail for this engine's queues: parked admin commands
    /// that ended complete on their admin queues; Aborts of commands on
    /// its IO queues are looked into and answered. False: none came.
    pub fn mail(&mut self, r: &mut Requests) -> bool {
        let (_, conns, io) = r.parts();
        let Some(mail) = self.take_mail(conns, io) else {
            return false;
        };
        for (id, cid, d) in mail.done {
            Self::admin_ended(id, cid, d, conns);
            io.touch(id);
        }
        let answers: Vec<(u16, u16, bool)> = (mail.aborts.into_iter())
            .map(|(id, a)| (a.cntlid, a.abort_cid, Self::abort(id, a.cid, r)))
            .collect();
        Self::aborts_answered(&answers, r.parts().2);
        true
    }

    /// An Abort names command `cid` of IO queue `id`: whether it was
    /// aborted. One still waiting (for a slot, the pacer, its buffers or
    /// its turn) completes as Command Abort Requested now, and its buffers
    /// and slot go back; one whose data an R2T asked for completes so once
    /// that data is in (the host sends it regardless); one at its device,
    /// or answered, is not aborted.
    fn abort(id: ConnId, cid: u16, r: &mut Requests) -> bool {
        let (slots, conns, io) = r.parts();
        io.touch(id);
        let slot = match Self::find(id, cid, conns) {
            Found::Aborted => return true,
            Found::Missing => return false,
            Found::Slot(slot) => slot,
        };
        let req = &mut slots[slot];
        match req.state() {
            ReqStage::Pacing | ReqStage::NeedBuffers | ReqStage::Deferred => {
                Self::aborted(id, cid, slot, conns);
                r.abort(slot);
                true
            }
            ReqStage::Receiving if req.fault().is_none() => {
                req.set_fault(Status::ABORT_REQUESTED);
                true
            }
            _ => false,
        }
    }

    /// A parked admin command of admin queue `id` ended.
    pub fn admin_ended(id: ConnId, cid: u16, d: Option<AdminDone>, conns: &mut Conns) {
        if let Some(n) = conns.get_mut(id).and_then(nvme_of) {
            n.queue_mut().aer_end(cid, d);
        }
    }

    /// Where command `cid` of IO queue `id` is, for an Abort: one still
    /// waiting for a request slot is aborted here.
    pub fn find(id: ConnId, cid: u16, conns: &mut Conns) -> Found {
        let Some(n) = conns.get_mut(id).and_then(nvme_of) else {
            return Found::Missing;
        };
        if n.forget_waiting(cid) {
            let aborted = n.queue_mut().abort_cmd(cid);
            debug_assert!(aborted, "a waiting command {cid} the queue lacks");
            return Found::Aborted;
        }
        n.slots().get(cid).map_or(Found::Missing, Found::Slot)
    }

    /// Command `cid`, holding request slot `slot` not yet at its device,
    /// is aborted: it completes as Command Abort Requested, and lets its
    /// slot go (the engine releases the request).
    pub fn aborted(id: ConnId, cid: u16, slot: ReqId, conns: &mut Conns) {
        let Some(n) = conns.get_mut(id).and_then(nvme_of) else {
            return;
        };
        let held = n.slots_mut().remove(cid);
        debug_assert_eq!(held, Some(slot));
        let aborted = n.queue_mut().abort_cmd(cid);
        debug_assert!(aborted, "command {cid} the queue lacks, or receiving");
    }

    /// Aborts the engine looked for, answered: (controller, the Abort's
    /// command id, whether its command was aborted).
    pub fn aborts_answered(answers: &[(u16, u16, bool)], io: &IoPath) {
        if let Some(t) = io.catalog().nvme.as_ref().filter(|_| !answers.is_empty()) {
            t.with(|t| {
                for &(cntlid, abort_cid, aborted) in answers {
                    t.io_abort_done(cntlid, abort_cid, aborted);
                }
            });
        }
    }

    /// What the queue wrote (ICResp, R2Ts, admin completions) goes out.
    pub fn flush(id: ConnId, conns: &mut Conns) {
        let Some(c) = conns.get_mut(id) else {
            return;
        };
        if c.nvme_output() {
            conns.mark_send(id);
        }
    }

    /// Every `CHECK_EVERY`: the controllers' keep-alive timers run, and
    /// queues whose controller (or IO queue) is gone close. False when it
    /// is not time yet (or there is no target): nothing changed.
    pub fn check(&mut self, r: &mut Requests) -> bool {
        let (_, conns, io) = r.parts();
        let Some(gone) = self.gone_queues(conns, io) else {
            return false;
        };
        for id in gone {
            if let Some(c) = r.conn(id) {
                c.ending(EndReason::ControllerGone);
            }
            r.close(id);
        }
        true
    }

    /// The queues whose controller (or IO queue) is gone, once it is time
    /// to check; Connects waiting for a QID are decided again first.
    fn gone_queues(&mut self, conns: &mut Conns, io: &mut IoPath) -> Option<Vec<ConnId>> {
        if self.open == 0 || io.now() < self.check_at {
            return None;
        }
        self.check_at = io.now() + CHECK_EVERY;
        let t = io.catalog().nvme.clone()?;
        self.rechecks(conns, io);
        let mut target = t.target.lock().ok()?;
        // I/O queues that took commands keep their controllers alive
        // (traffic based keep alive), before the timers are checked.
        for c in conns.iter_mut() {
            let Phase::Nvme(n) = c.phase_mut() else {
                continue;
            };
            match n.bound() {
                Some((cntlid, qid, _)) if qid != 0 && n.took_commands() => {
                    target.traffic(cntlid, io.now())
                }
                _ => {}
            }
        }
        target.tick(io.now());
        // Each engine checks its own queues below; the list is not needed.
        target.take_dropped();
        let mut gone = Vec::new();
        for c in conns.iter_mut() {
            let Phase::Nvme(n) = &c.phase() else { continue };
            match n.bound() {
                Some((cntlid, qid, _)) if !target.queue_live(cntlid, qid) => {
                    gone.push((c.id(), cntlid))
                }
                _ => {}
            }
        }
        drop(target);
        for &(id, cntlid) in &gone {
            tracing::info!(
                reactor = self.reactor,
                cntlid,
                conn = id.index,
                "nvme/tcp: controller gone, closing its queue"
            );
        }
        Some(gone.into_iter().map(|(id, _)| id).collect())
    }

    /// NVMe/TCP connections open.
    pub fn open(&self) -> u32 {
        self.open
    }

    /// When `tick` next has work.
    pub fn deadline(&self) -> Option<pace::Nanos> {
        (self.open > 0).then_some(self.check_at)
    }

    /// A connection of this engine opened (true) or went (false).
    pub fn count(&mut self, opened: bool, now: pace::Nanos) {
        if opened {
            if self.open == 0 {
                self.check_at = now + CHECK_EVERY;
            }
            self.open += 1;
        } else {
            debug_assert!(self.open > 0);
            self.open -= 1;
        }
    }
}
