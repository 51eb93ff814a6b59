//! One NVMe/TCP connection's state (`Phase::Nvme`): its sans-IO queue,
//! the controller it is bound to, and its commands that hold or wait for
//! a request slot. The front end that drives it is `nvme.rs`.

use std::collections::VecDeque;

use proto::nvme::queue::{DevOp, Queue};
use proto::nvme::Sqe;
use proto::Command;

use super::ids::ReqId;
use super::slot::Req;
use super::states::ReqStage;
use crate::exports::Catalog;

/// An I/O queue's Connect naming a QID still in use is checked again every
/// `QID_RECHECK` for up to `QID_WAIT` (SPDK's target checks once, after
/// 1 ms): a host reuses a QID as soon as it drops the queue, and the old
/// queue's close may reach another reactor after the new Connect (17 ms
/// later in a loaded debug build).
pub(super) const QID_RECHECK: pace::Nanos = 1_000_000;
pub(super) const QID_WAIT: pace::Nanos = 100_000_000;
/// Connect's dword 0 for a QID out of range or in use: the field's offset.
pub(super) const QID_IN_USE: u32 = 42;

/// A Fabrics Connect command: when it came, its command id, SQE and data.
pub(super) struct Connect {
    pub since: pace::Nanos,
    pub cid: u16,
    pub sqe: Sqe,
    pub data: Vec<u8>,
}

/// One NVMe/TCP connection (one queue of a controller).
pub struct NvmeConn {
    queue: Queue,
    /// (cntlid, qid, export) once its Connect succeeded; the discovery
    /// controller has no export.
    bound: Option<(u16, u16, Option<u16>)>,
    /// Commands holding a request slot, in arrival order.
    slots: CidSlots,
    /// Commands waiting for a slot or for the connection's share of the
    /// pool, in arrival order.
    waiting: VecDeque<Waiting>,
    /// A Connect whose QID was in use, decided again at the next check.
    recheck: Option<Connect>,
    /// The queue's command count when the front end last looked
    /// (`took_commands`).
    commands_seen: u64,
}

/// A command that needs a request slot.
#[derive(Debug)]
pub(super) enum Waiting {
    /// A READ or WRITE asking for admission.
    Data { cid: u16, write: bool },
    /// A command without data the device runs.
    Op { cid: u16, op: DevOp },
}

impl Waiting {
    pub(super) fn cid(&self) -> u16 {
        match self {
            Waiting::Data { cid, .. } | Waiting::Op { cid, .. } => *cid,
        }
    }
}

/// A queue's commands that hold request slots, in arrival order: what is
/// aborted when its input ends goes in that order, the same every run.
/// At most the queue's depth (128): a scan of a few cache lines costs less
/// than hashing, and a reply, mostly of the oldest, removes near the front.
/// Each entry says whether its command is a WRITE, and the WRITEs are
/// counted: a queue with none has no data due (`NvmeConn::data_due`)
/// without a scan.
#[derive(Debug, Default)]
pub(super) struct CidSlots {
    held: VecDeque<(u16, ReqId, bool)>,
    writes: usize,
}

impl CidSlots {
    /// Command `cid` (a WRITE if `write`) holds `slot`.
    pub(super) fn insert(&mut self, cid: u16, slot: ReqId, write: bool) {
        debug_assert!(self.get(cid).is_none(), "command {cid} holds two slots");
        self.held.push_back((cid, slot, write));
        self.writes += usize::from(write);
    }

    pub(super) fn get(&self, cid: u16) -> Option<ReqId> {
        self.held.iter().find(|e| e.0 == cid).map(|e| e.1)
    }

    pub(super) fn remove(&mut self, cid: u16) -> Option<ReqId> {
        // Most replies are of the oldest: take it without the general scan
        // and shift (86 instructions a call to 52 at 4 KiB QD 32).
        let (_, slot, write) = match self.held.front() {
            Some(e) if e.0 == cid => self.held.pop_front()?,
            _ => {
                let at = self.held.iter().position(|e| e.0 == cid)?;
                self.held.remove(at)?
            }
        };
        self.writes -= usize::from(write);
        Some(slot)
    }

    /// The slots, oldest command first.
    pub(super) fn in_order(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.held.iter().map(|e| e.1)
    }

    /// Whether a WRITE holds a slot.
    pub(super) fn any_write(&self) -> bool {
        self.writes > 0
    }

    pub(super) fn clear(&mut self) {
        self.held.clear();
        self.writes = 0;
    }
}

impl NvmeConn {
    pub fn new(catalog: &Catalog) -> NvmeConn {
        let limits = catalog
            .nvme
            .as_ref()
            .and_then(|n| n.target.lock().ok().map(|t| t.limits))
            .unwrap_or_default();
        NvmeConn {
            queue: Queue::external(limits),
            bound: None,
            slots: CidSlots::default(),
            waiting: VecDeque::new(),
            recheck: None,
            commands_seen: 0,
        }
    }

    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    pub(super) fn slots(&self) -> &CidSlots {
        &self.slots
    }

    pub(super) fn slots_mut(&mut self) -> &mut CidSlots {
        &mut self.slots
    }

    /// (cntlid, qid, export) once its Connect succeeded.
    pub fn bound(&self) -> Option<(u16, u16, Option<u16>)> {
        self.bound
    }

    /// Its Connect succeeded: controller `cntlid`, queue `qid`, serving
    /// `export` (none for the discovery controller).
    pub fn bind(&mut self, cntlid: u16, qid: u16, export: Option<u16>) {
        self.bound = Some((cntlid, qid, export));
    }

    /// Whether its queue took commands since the last call: an I/O queue's
    /// restart its controller's keep-alive timer (`Target::traffic`).
    pub(super) fn took_commands(&mut self) -> bool {
        let n = self.queue.commands();
        let moved = n != self.commands_seen;
        self.commands_seen = n;
        moved
    }

    /// A Connect whose QID was in use waits for the next check.
    pub(super) fn recheck_later(&mut self, cmd: Connect) {
        self.recheck = Some(cmd);
    }

    pub(super) fn take_recheck(&mut self) -> Option<Connect> {
        self.recheck.take()
    }

    /// A command waits for a slot (or for the connection's share).
    pub(super) fn wait(&mut self, w: Waiting) {
        self.waiting.push_back(w);
    }

    pub(super) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The oldest waiting command, taken.
    pub(super) fn next_waiting(&mut self) -> Option<Waiting> {
        self.waiting.pop_front()
    }

    /// Forgets waiting command `cid`; false if none waits.
    pub(super) fn forget_waiting(&mut self, cid: u16) -> bool {
        let Some(at) = self.waiting.iter().position(|w| w.cid() == cid) else {
            return false;
        };
        self.waiting.remove(at);
        true
    }

    /// The connection closed: its queue aborts every command, its waiting
    /// commands, slots and recheck are dropped; returns its binding.
    pub(super) fn close(&mut self) -> Option<(u16, u16, Option<u16>)> {
        self.queue.abort_all();
        self.waiting.clear();
        self.slots.clear();
        self.recheck = None;
        self.bound.take()
    }

    /// Past ICReq.
    pub fn initialized(&self) -> bool {
        self.queue.digests().is_some()
    }

    /// Where the data of the H2CData PDU arriving may be received straight
    /// into its WRITE's buffers (no copy from the receive buffer): the
    /// WRITE, and where and how many bytes (up to the end of its buffer
    /// there). Only when at least `min` bytes are due, and the WRITE still
    /// wants them (receiving, not aborted).
    pub fn h2c_target(&self, reqs: &[Req], min: u32) -> Option<(ReqId, *mut u8, usize)> {
        let (cid, at, due) = self.queue.inflow()?;
        let slot = self.slots.get(cid)?;
        let req = reqs.get(slot.index())?;
        if due < min || req.state() != ReqStage::Receiving || req.fault().is_some() {
            return None;
        }
        let (buf, room) = req.data_at(at)?;
        Some((slot, buf, room.min(due as usize)))
    }

    /// Whether a WRITE of this queue still wants `min` bytes or more of its
    /// data (its R2T is out, or goes out once the pacer and the pool let
    /// it): the receive buffer then takes little at a time
    /// (`conn::H2C_HEAD_RECV`), so the bulk of its H2CData lands straight
    /// in its buffers (`h2c_target`). A recv is posted before the R2T goes
    /// out, so the WRITEs still pacing count too.
    pub fn data_due(&self, reqs: &[Req], min: u32) -> bool {
        if !self.slots.any_write() {
            return false;
        }
        self.slots.in_order().any(|r| {
            let q = &reqs[r.index()];
            let waits = matches!(
                q.state(),
                ReqStage::Pacing | ReqStage::NeedBuffers | ReqStage::Receiving
            );
            waits
                && q.command() == Command::Write
                && q.fault().is_none()
                && q.filled() + min <= q.len()
        })
    }

    /// The export its subsystem serves, once connected.
    pub fn export(&self) -> Option<u16> {
        self.bound.and_then(|(_, _, e)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cid_slots_count_the_writes_they_hold() {
        let mut s = CidSlots::default();
        assert!(!s.any_write());
        s.insert(1, ReqId(0), false);
        s.insert(2, ReqId(1), true);
        s.insert(3, ReqId(2), true);
        assert!(s.any_write());
        assert_eq!(s.remove(2), Some(ReqId(1)));
        assert!(s.any_write());
        assert_eq!(s.remove(9), None);
        assert_eq!(s.remove(3), Some(ReqId(2)));
        assert!(!s.any_write());
        assert_eq!(s.in_order().collect::<Vec<_>>(), vec![ReqId(0)]);
        s.insert(4, ReqId(3), true);
        s.clear();
        assert!(!s.any_write());
    }
}
