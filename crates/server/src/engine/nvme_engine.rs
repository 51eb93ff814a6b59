//! The engine's side of the NVMe/TCP front end (`nvme.rs`): a queue's
//! PDUs in, its waiting commands started, and the target's mail (Aborts of
//! IO commands, parked admin commands ended) carried out.

use super::conn::{EndReason, Step};
use super::ids::ConnId;
use super::nvme::{Found, NvmeFront};
use super::nvme_data::Next;
use super::states::ReqStage;
use super::Engine;

/// The NVMe/TCP front end's requests of the engine (`nvme.rs`).
impl Engine {
    /// Feeds the connection's buffered bytes to its NVMe/TCP queue and
    /// carries out what the queue asks: every whole PDU is consumed at once.
    pub(super) fn nvme_input(&mut self, id: ConnId) -> Step {
        let Some(used) = self.conns.get_mut(id).and_then(NvmeFront::receive) else {
            return Step::Stop;
        };
        // The data ranges point into the bytes just given: act on them
        // before those bytes are let go.
        while let Some(actions) = NvmeFront::take_actions(self.conns.get_mut(id)) {
            if actions.is_empty() {
                break;
            }
            for a in actions {
                let (conns, slots, io) = (&mut self.conns, &mut self.slots, &mut self.io);
                match self.nvme.act(id, a, conns, slots, io) {
                    Next::Done => {}
                    Next::StartWaiting => self.nvme_start_waiting(id),
                    Next::Advance(r) => self.advance(r),
                    Next::InputEnded => self.input_ended(id),
                }
            }
        }
        if let Some(c) = self.conns.get_mut(id) {
            c.rstart += used;
        }
        Step::Stop
    }

    /// No more bytes come: WRITEs waiting for their data never get it.
    pub(super) fn nvme_input_ended(&mut self, id: ConnId) {
        for r in NvmeFront::requests_of(id, &mut self.conns) {
            if self.slots.reqs[r.index()].state == ReqStage::Receiving {
                self.abort(r);
            }
        }
    }

    /// Every 100 ms: the controllers' keep-alive timers run, and queues
    /// whose controller (or IO queue) is gone close. Mail from the target
    /// is taken at once.
    pub(super) fn nvme_tick(&mut self) {
        // An Abort's answer is mail too: an Abort whose queues are both
        // here completes in this tick.
        for _ in 0..3 {
            if !self.nvme_mail() {
                break;
            }
        }
        let Some(gone) = self.nvme.tick(&mut self.conns, &mut self.io) else {
            return;
        };
        for id in gone {
            if let Some(c) = self.conns.get_mut(id) {
                c.ending(EndReason::ControllerGone);
            }
            self.close(id);
        }
        self.settle();
    }

    /// The target's mail for this engine's queues: parked admin commands
    /// that ended complete on their admin queues; Aborts of commands on
    /// its IO queues are looked into and answered. False: none came.
    fn nvme_mail(&mut self) -> bool {
        let Some(mail) = self.nvme.take_mail(&mut self.conns, &self.io) else {
            return false;
        };
        for (id, cid, d) in mail.done {
            NvmeFront::admin_ended(id, cid, d, &mut self.conns);
            self.io.touched.push(id);
        }
        let answers: Vec<(u16, u16, bool)> = (mail.aborts.into_iter())
            .map(|(id, a)| (a.cntlid, a.abort_cid, self.nvme_abort(id, a.cid)))
            .collect();
        NvmeFront::aborts_answered(&answers, &self.io);
        self.settle();
        true
    }

    /// An Abort names command `cid` of IO queue `id`: whether it was
    /// aborted. One still waiting (for a slot, the pacer, its buffers or
    /// its turn) completes as Command Abort Requested now, and its buffers
    /// and slot go back; one whose data an R2T asked for completes so once
    /// that data is in (the host sends it regardless); one at its device,
    /// or answered, is not aborted.
    fn nvme_abort(&mut self, id: ConnId, cid: u16) -> bool {
        self.io.touched.push(id);
        let slot = match NvmeFront::find(id, cid, &mut self.conns) {
            Found::Aborted => return true,
            Found::Missing => return false,
            Found::Slot(slot) => slot,
        };
        let req = &mut self.slots.reqs[slot.index()];
        match req.state {
            ReqStage::Pacing | ReqStage::NeedBuffers | ReqStage::Deferred => {
                NvmeFront::aborted(id, cid, slot, &mut self.conns);
                self.abort(slot);
                true
            }
            ReqStage::Receiving if req.fault.is_none() => {
                req.fault = Some(proto::nvme::Status::ABORT_REQUESTED);
                true
            }
            _ => false,
        }
    }

    /// Starts waiting commands, one at a time, while a slot is free and
    /// the connection's requests hold less than its share of the pool.
    pub(super) fn nvme_start_waiting(&mut self, id: ConnId) {
        let cap = self.conn_cap;
        loop {
            let (conns, slots, io) = (&mut self.conns, &mut self.slots, &mut self.io);
            let Some(slot) = self.nvme.start_next(id, cap, conns, slots, io) else {
                return;
            };
            self.advance(slot);
        }
    }
}
