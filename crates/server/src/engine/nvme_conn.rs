//! One NVMe/TCP connection's state (`Phase::Nvme`): its sans-IO queue,
//! the controller it is bound to, and its commands that hold or wait for
//! a request slot. The front end that drives it is `nvme.rs`.

use std::collections::{HashMap, VecDeque};

use proto::nvme::queue::{DevOp, Queue};

use super::ids::ReqId;
use crate::exports::Catalog;

/// One NVMe/TCP connection (one queue of a controller).
pub struct NvmeConn {
    pub(super) queue: Queue,
    /// (cntlid, qid, export) once its Connect succeeded; the discovery
    /// controller has no export.
    pub(super) bound: Option<(u16, u16, Option<u16>)>,
    /// Commands holding a request slot, by command id.
    pub(super) slots: HashMap<u16, ReqId>,
    /// Commands waiting for a slot or for the connection's share of the
    /// pool, in arrival order.
    pub(super) waiting: VecDeque<Waiting>,
}

/// A command that needs a request slot.
#[derive(Debug)]
pub(super) enum Waiting {
    /// A READ or WRITE asking for admission.
    Data { cid: u16, write: bool },
    /// A command without data the device runs.
    Op { cid: u16, op: DevOp },
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
            slots: HashMap::new(),
            waiting: VecDeque::new(),
        }
    }

    /// Past ICReq.
    pub fn initialized(&self) -> bool {
        self.queue.digests().is_some()
    }

    /// The export its subsystem serves, once connected.
    pub fn export(&self) -> Option<u16> {
        self.bound.and_then(|(_, _, e)| e)
    }
}
