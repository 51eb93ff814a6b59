//! One controller: the state a host's admin queue and IO queues share.
//! Properties (CAP, VS, CC, CSTS), features, keep-alive and async events.

use std::collections::{BTreeSet, VecDeque};

use super::pages::VERSION;
use super::{Limits, Nanos};
use crate::nvme::cmd::Status;

/// Property offsets.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;
}

/// Feature identifiers.
pub mod feat {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MGMT: u8 = 0x02;
    pub const TEMP_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const WRITE_CACHE: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const IRQ_COALESCING: u8 = 0x08;
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const KEEP_ALIVE: u8 = 0x0F;
}

const CC_EN: u32 = 1;
const CC_SHN: u32 = 3 << 14;
const CSTS_RDY: u32 = 1;
const CSTS_SHST_OCCURRING: u32 = 1 << 2;
const CSTS_SHST_DONE: u32 = 2 << 2;
const CSTS_SHST: u32 = 3 << 2;

/// A controller, as a Connect on its admin queue created it.
#[derive(Debug, Clone)]
pub struct Controller {
    pub cntlid: u16,
    /// Index of its subsystem in the target; None: the discovery controller.
    pub subsys: Option<usize>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// The host may only read (`read_only_for`): namespaces write-protected.
    pub read_only: bool,
    pub(super) cc: u32,
    pub(super) csts: u32,
    pub(super) kato_ms: u32,
    pub(super) ka_deadline: Option<Nanos>,
    /// IO queues granted by Set Features (Number of Queues).
    pub(super) io_queues: u16,
    /// IO queue ids connected.
    pub(super) connected: BTreeSet<u16>,
    /// IO queue ids a reset or shutdown dropped whose connections are not
    /// closed yet: not reusable, and the reset or shutdown is not done.
    pub(super) closing: BTreeSet<u16>,
    pub(super) aec: u32,
    /// Other features' values, by feature id.
    pub(super) features: [u32; 16],
    /// Async Event Requests waiting for an event (their command ids).
    pub(super) aers: Vec<u16>,
    /// Aborts of IO commands waiting for their IO queue's driver: (the
    /// Abort's command id, the SQID it names), at most `MAX_ABORTS`.
    pub(super) aborts: Vec<(u16, u16)>,
    /// Events (completion dword 0) no AER has taken yet.
    pub(super) events: VecDeque<u32>,
    pub(super) changed_ns: Vec<u32>,
    /// A namespace attribute notice was reported and its log page (04h)
    /// not yet read: further changes only join the list.
    pub(super) ns_notice_out: bool,
    pub(super) errors: u64,
    pub(super) queue_size: u16,
}

impl Controller {
    pub(super) fn new(cntlid: u16, subsys: Option<usize>, limits: &Limits) -> Controller {
        let mut features = [0u32; 16];
        features[usize::from(feat::WRITE_CACHE)] = 1;
        features[usize::from(feat::ERROR_RECOVERY)] = 0;
        features[usize::from(feat::TEMP_THRESHOLD)] = u32::from(super::pages::WARNING_TEMP_K);
        Controller {
            cntlid,
            subsys,
            hostnqn: String::new(),
            hostid: [0; 16],
            read_only: false,
            cc: 0,
            csts: 0,
            kato_ms: limits.default_kato_ms,
            ka_deadline: None,
            io_queues: limits.max_io_queues,
            connected: BTreeSet::new(),
            closing: BTreeSet::new(),
            aec: 0,
            features,
            aers: Vec::new(),
            aborts: Vec::new(),
            events: VecDeque::new(),
            changed_ns: Vec::new(),
            ns_notice_out: false,
            errors: 0,
            queue_size: limits.max_queue_size,
        }
    }

    /// CC.EN and CSTS.RDY: IO queues may connect.
    pub fn enabled(&self) -> bool {
        self.cc & CC_EN != 0 && self.csts & CSTS_RDY != 0
    }

    /// Restarts the keep-alive timer (a Keep Alive or any admin command).
    pub(super) fn keep_alive(&mut self, now: Nanos) {
        self.ka_deadline =
            (self.kato_ms > 0).then(|| now.saturating_add(u64::from(self.kato_ms) * 1_000_000));
    }

    /// Property Get: `size8` for an 8-byte access.
    pub(super) fn get_property(
        &self,
        ofst: u32,
        size8: bool,
        limits: &Limits,
    ) -> Result<u64, Status> {
        let (v, eight) = match ofst {
            prop::CAP => (self.cap(limits), true),
            prop::VS => (u64::from(VERSION), false),
            prop::CC => (u64::from(self.cc), false),
            prop::CSTS => (u64::from(self.csts), false),
            prop::NSSR => (0, false),
            _ => return Err(Status::INVALID_FIELD),
        };
        if eight != size8 {
            return Err(Status::INVALID_FIELD);
        }
        Ok(v)
    }

    fn cap(&self, limits: &Limits) -> u64 {
        let mqes = u64::from(limits.max_queue_size.max(2) - 1);
        let cqr = 1 << 16;
        let to = 30 << 24; // 15 s in 500 ms units
        let css_nvm = 1 << 37;
        mqes | cqr | to | css_nvm
    }

    /// Property Set. Returns true when the controller was reset or shut
    /// down, so its IO queues must go.
    pub(super) fn set_property(
        &mut self,
        ofst: u32,
        size8: bool,
        value: u64,
    ) -> Result<bool, Status> {
        match (ofst, size8) {
            (prop::CC, false) => Ok(self.set_cc(value as u32)),
            (prop::NSSR, false) => Ok(false),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    fn set_cc(&mut self, cc: u32) -> bool {
        let was = self.cc;
        self.cc = cc;
        let mut teardown = false;
        if cc & CC_SHN != 0 && was & CC_SHN == 0 {
            // Normal or abrupt shutdown: nothing is cached; done once the
            // IO queues' connections are closed (`settle`).
            self.csts = (self.csts & !CSTS_SHST) | CSTS_SHST_OCCURRING;
            teardown = true;
        }
        if cc & CC_EN != 0 && was & CC_EN == 0 {
            self.csts |= CSTS_RDY;
            self.csts &= !CSTS_SHST;
        } else if cc & CC_EN == 0 && was & CC_EN != 0 {
            // Controller reset: the target completes the parked AERs
            // (teardown). CSTS.RDY clears once the IO queues' connections
            // are closed (`settle`), as SPDK's target does: the host waits
            // for it before it enables again, so a QID it connects anew is
            // never one an old connection still serves.
            teardown = true;
        }
        if teardown {
            self.closing.extend(std::mem::take(&mut self.connected));
            self.settle();
        }
        teardown
    }

    /// Whether IO queue id `qid` is taken: connected, or dropped by a
    /// reset or shutdown whose connection is not closed yet.
    pub(super) fn qid_busy(&self, qid: u16) -> bool {
        self.connected.contains(&qid) || self.closing.contains(&qid)
    }

    /// IO queue `qid`'s connection closed.
    pub(super) fn queue_gone(&mut self, qid: u16) {
        self.connected.remove(&qid);
        if self.closing.remove(&qid) {
            self.settle();
        }
    }

    /// A reset or shutdown is done once no IO queue it dropped is still
    /// connected: CSTS.RDY clears (reset), SHST says complete (shutdown).
    fn settle(&mut self) {
        if !self.closing.is_empty() {
            return;
        }
        if self.cc & CC_EN == 0 {
            self.csts &= !CSTS_RDY;
        }
        if self.csts & CSTS_SHST == CSTS_SHST_OCCURRING {
            self.csts = (self.csts & !CSTS_SHST) | CSTS_SHST_DONE;
        }
    }

    /// Get Features: dword 0 of the completion.
    pub(super) fn get_feature(&self, fid: u8) -> Result<u32, Status> {
        Ok(match fid {
            feat::NUM_QUEUES => {
                let n = u32::from(self.io_queues.max(1) - 1);
                n | (n << 16)
            }
            feat::KEEP_ALIVE => self.kato_ms,
            feat::ASYNC_EVENT_CONFIG => self.aec,
            feat::ARBITRATION
            | feat::POWER_MGMT
            | feat::TEMP_THRESHOLD
            | feat::ERROR_RECOVERY
            | feat::WRITE_CACHE
            | feat::IRQ_COALESCING
            | feat::WRITE_ATOMICITY => self.features[usize::from(fid)],
            _ => return Err(Status::INVALID_FIELD),
        })
    }

    /// Set Features with CDW11 `v`; dword 0 of the completion.
    pub(super) fn set_feature(
        &mut self,
        fid: u8,
        v: u32,
        limits: &Limits,
        now: Nanos,
    ) -> Result<u32, Status> {
        match fid {
            feat::NUM_QUEUES => {
                if !self.connected.is_empty() {
                    return Err(Status::COMMAND_SEQUENCE_ERROR);
                }
                let want = (v & 0xFFFF).min(v >> 16);
                if want == 0xFFFF {
                    return Err(Status::INVALID_FIELD);
                }
                let granted = (want + 1).min(u32::from(limits.max_io_queues));
                self.io_queues = granted as u16;
                let n = granted.max(1) - 1;
                Ok(n | (n << 16))
            }
            feat::KEEP_ALIVE => {
                self.kato_ms = v;
                self.keep_alive(now);
                Ok(0)
            }
            feat::ASYNC_EVENT_CONFIG => {
                self.aec = v;
                Ok(0)
            }
            feat::ARBITRATION
            | feat::POWER_MGMT
            | feat::TEMP_THRESHOLD
            | feat::ERROR_RECOVERY
            | feat::WRITE_CACHE
            | feat::IRQ_COALESCING
            | feat::WRITE_ATOMICITY => {
                self.features[usize::from(fid)] = v;
                Ok(0)
            }
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Takes an Async Event Request: returns the event at once if one is
    /// pending, else parks it (None). Too many parked: an error.
    pub(super) fn async_event(&mut self, cid: u16) -> Result<Option<u32>, Status> {
        if let Some(ev) = self.events.pop_front() {
            return Ok(Some(ev));
        }
        if self.aers.len() >= super::MAX_AERS {
            return Err(Status::ASYNC_EVENT_LIMIT);
        }
        self.aers.push(cid);
        Ok(None)
    }

    /// Lets go of parked Async Event Request `cid`; false if none is parked.
    pub(super) fn abort_aer(&mut self, cid: u16) -> bool {
        let before = self.aers.len();
        self.aers.retain(|&a| a != cid);
        self.aers.len() < before
    }

    /// Lets go of every parked Async Event Request: their command ids.
    pub(super) fn take_aers(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.aers)
    }

    /// Parks Abort `cid` of a command on `sqid`; false when `MAX_ABORTS`
    /// are parked already.
    pub(super) fn park_abort(&mut self, cid: u16, sqid: u16) -> bool {
        if self.aborts.len() >= usize::from(super::MAX_ABORTS) {
            return false;
        }
        self.aborts.push((cid, sqid));
        true
    }

    /// Parked Abort `cid` completes; false if it is not parked.
    pub(super) fn unpark_abort(&mut self, cid: u16) -> bool {
        let before = self.aborts.len();
        self.aborts.retain(|&(a, _)| a != cid);
        self.aborts.len() < before
    }

    /// The parked Aborts of commands on `sqid`: their command ids.
    pub(super) fn aborts_on(&self, sqid: u16) -> Vec<u16> {
        let on = self.aborts.iter().filter(|&&(_, q)| q == sqid);
        on.map(|&(a, _)| a).collect()
    }

    /// Lets go of every parked Abort: their command ids.
    pub(super) fn take_aborts(&mut self) -> Vec<u16> {
        let all = std::mem::take(&mut self.aborts);
        all.into_iter().map(|(a, _)| a).collect()
    }
}
