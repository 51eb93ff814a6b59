//! The target: every subsystem, every controller, Fabrics Connect and the
//! admin commands. A driver owns one (shared by all its connections) and
//! routes each queue's Connect and admin commands here.

use std::collections::BTreeMap;

use super::connect::{invalid, Connect};
use super::controller::Controller;
use super::pages::{self, CtrlView};
use super::{Limits, Listener, Namespace, Nanos, Subsystem, DISCOVERY_NQN};
use crate::nvme::cmd::{admin, fctype, Sqe, Status};
use crate::Access;

/// Async Event Configuration bit 8: namespace attribute notices.
const AEC_NS_ATTRIBUTE: u32 = 1 << 8;

/// A queue's successful Connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    pub cntlid: u16,
    pub qid: u16,
    /// Entries of the queue (SQSIZE + 1).
    pub queue_size: u16,
    /// The subsystem's index; None: the discovery controller.
    pub subsys: Option<usize>,
    /// The namespaces an IO queue serves.
    pub namespaces: Vec<Namespace>,
}

/// An admin command's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdminDone {
    pub status: Status,
    /// Completion dwords 0 and 1.
    pub result: u64,
    /// Data for the host (Identify, Get Log Page).
    pub data: Vec<u8>,
    /// An Async Event Request parked: it completes later (`take_events`,
    /// `take_events_of`).
    pub parked: bool,
}

impl AdminDone {
    fn status(status: Status) -> AdminDone {
        AdminDone {
            status,
            ..AdminDone::default()
        }
    }

    fn result(result: u64) -> AdminDone {
        AdminDone {
            result,
            ..AdminDone::default()
        }
    }

    fn data(data: Vec<u8>) -> AdminDone {
        AdminDone {
            data,
            ..AdminDone::default()
        }
    }
}

/// Every subsystem and controller of a target.
#[derive(Debug, Clone)]
pub struct Target {
    pub subsystems: Vec<Subsystem>,
    pub listeners: Vec<Listener>,
    pub limits: Limits,
    controllers: BTreeMap<u16, Controller>,
    next_cntlid: u16,
    dropped: Vec<u16>,
    /// Parked admin commands ended (Async Event Requests, Aborts of IO
    /// commands): (cntlid, cid, completion), no completion when a reset
    /// or shutdown let them go.
    events: Vec<(u16, u16, Option<AdminDone>)>,
    /// Aborts of IO commands the driver of the IO queue has not taken yet.
    io_aborts: Vec<IoAbort>,
    /// Entries ever added to `events` and `io_aborts` (`posted`).
    posted: u64,
}

/// An Abort of an IO command, parked until the driver of its IO queue
/// (`take_io_aborts_of`) says whether the command was aborted
/// (`io_abort_done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoAbort {
    pub cntlid: u16,
    pub sqid: u16,
    /// The command to abort.
    pub cid: u16,
    /// The Abort's own command id, on the admin queue.
    pub abort_cid: u16,
}

impl Target {
    pub fn new(subsystems: Vec<Subsystem>, listeners: Vec<Listener>, limits: Limits) -> Target {
        Target {
            subsystems,
            listeners,
            limits,
            controllers: BTreeMap::new(),
            next_cntlid: 1,
            dropped: Vec::new(),
            events: Vec::new(),
            io_aborts: Vec::new(),
            posted: 0,
        }
    }

    pub fn controller(&self, cntlid: u16) -> Option<&Controller> {
        self.controllers.get(&cntlid)
    }

    pub fn controllers(&self) -> usize {
        self.controllers.len()
    }

    /// Fabrics Connect with its 1024 bytes of data. Err: the status and
    /// completion dword 0 (where an invalid parameter lies). Hosts are
    /// admitted by each subsystem's `hosts` list.
    pub fn connect(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        now: Nanos,
    ) -> Result<Connected, (Status, u32)> {
        let subs = self.subsystems.clone();
        self.connect_with(sqe, data, now, &|i, host| {
            if subs[i].allows(host) {
                Access::ReadWrite
            } else {
                Access::Denied
            }
        })
    }

    /// As `connect`, with the driver deciding what a host may do with a
    /// subsystem (`access(subsystem index, hostnqn)`): a read-only host's
    /// controller sees its namespaces write-protected.
    pub fn connect_with(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        now: Nanos,
        access: &dyn Fn(usize, &str) -> Access,
    ) -> Result<Connected, (Status, u32)> {
        let c = Connect::parse(sqe, data)?;
        let (subsys, read_only) = if c.subnqn == DISCOVERY_NQN {
            (None, false)
        } else {
            let Some(i) = self.subsystems.iter().position(|s| s.nqn == c.subnqn) else {
                return Err(invalid(true, 256));
            };
            match access(i, c.hostnqn) {
                Access::Denied => return Err((Status::CONNECT_INVALID_HOST, 0)),
                a => (Some(i), a == Access::ReadOnly),
            }
        };
        let peer = Peer {
            subsys,
            hostnqn: c.hostnqn,
            hostid: c.hostid,
            cntlid: c.cntlid,
            read_only,
        };
        let size = if c.qid == 0 {
            self.connect_admin(&peer, c.sqsize, c.kato_ms, now)?
        } else {
            self.connect_io(&peer, c.qid, c.sqsize)?
        };
        let ro = self.controllers.get(&size.0).is_some_and(|c| c.read_only);
        let mut namespaces = subsys
            .map(|i| self.subsystems[i].namespaces.clone())
            .unwrap_or_default();
        for ns in &mut namespaces {
            ns.read_only |= ro;
        }
        Ok(Connected {
            cntlid: size.0,
            qid: c.qid,
            queue_size: size.1,
            subsys,
            namespaces,
        })
    }

    /// A new controller for an admin queue. Returns (cntlid, queue size).
    fn connect_admin(
        &mut self,
        p: &Peer<'_>,
        sqsize: u16,
        kato: u32,
        now: Nanos,
    ) -> Result<(u16, u16), (Status, u32)> {
        if sqsize == 0 || sqsize >= self.limits.max_admin_queue_size {
            return Err(invalid(false, 44));
        }
        if p.cntlid < 0xFFFE {
            return Err(invalid(true, 16)); // static controllers: none
        }
        let Some(cntlid) = self.free_cntlid() else {
            return Err((Status::CONNECT_CONTROLLER_BUSY, 0));
        };
        let mut c = Controller::new(cntlid, p.subsys, &self.limits);
        c.hostnqn = p.hostnqn.to_string();
        c.hostid = p.hostid;
        c.read_only = p.read_only;
        if kato > 0 {
            c.kato_ms = kato;
        }
        c.keep_alive(now);
        self.controllers.insert(cntlid, c);
        Ok((cntlid, sqsize + 1))
    }

    fn free_cntlid(&mut self) -> Option<u16> {
        for _ in 0..0xFFF0 {
            let id = self.next_cntlid;
            self.next_cntlid = if id >= 0xFFEF { 1 } else { id + 1 };
            if !self.controllers.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    fn connect_io(
        &mut self,
        p: &Peer<'_>,
        qid: u16,
        sqsize: u16,
    ) -> Result<(u16, u16), (Status, u32)> {
        let max = self.limits.max_queue_size;
        let Some(c) = self.controllers.get_mut(&p.cntlid) else {
            return Err(invalid(true, 16));
        };
        if p.subsys.is_none() || c.subsys != p.subsys {
            return Err(invalid(true, 256));
        }
        if c.hostnqn != p.hostnqn {
            return Err(invalid(true, 512));
        }
        if c.hostid != p.hostid {
            return Err(invalid(true, 0));
        }
        if !c.enabled() {
            return Err((Status::COMMAND_SEQUENCE_ERROR, 0));
        }
        if qid > c.io_queues || c.qid_busy(qid) {
            return Err(invalid(false, 42));
        }
        if sqsize == 0 || sqsize >= max {
            return Err(invalid(false, 44));
        }
        c.connected.insert(qid);
        Ok((p.cntlid, sqsize + 1))
    }

    /// A queue's connection ended. The admin queue's end ends its controller
    /// (its IO queues are then dropped: `take_dropped`).
    /// Aborts still parked for its commands complete as "not aborted".
    pub fn queue_closed(&mut self, cntlid: u16, qid: u16) {
        if qid == 0 {
            if self.controllers.remove(&cntlid).is_some() {
                self.forget(cntlid);
                self.dropped.push(cntlid);
            }
        } else if let Some(c) = self.controllers.get_mut(&cntlid) {
            c.queue_gone(qid);
            let parked = c.aborts_on(qid);
            self.take_io_aborts_of(cntlid, qid);
            for a in parked {
                self.io_abort_done(cntlid, a, false);
            }
        }
    }

    /// A controller went: what waited for it or its admin queue goes too.
    fn forget(&mut self, cntlid: u16) {
        self.io_aborts.retain(|a| a.cntlid != cntlid);
        self.events.retain(|e| e.0 != cntlid);
    }

    /// Forgets a parked Async Event Request the host gave up.
    pub fn drop_async_event(&mut self, cntlid: u16, cid: u16) {
        if let Some(c) = self.controllers.get_mut(&cntlid) {
            c.aers.retain(|&a| a != cid);
        }
    }

    /// Whether the controller still exists (IO queues of a dropped one close).
    pub fn alive(&self, cntlid: u16) -> bool {
        self.controllers.contains_key(&cntlid)
    }

    /// Whether queue `qid` of controller `cntlid` may still serve: its
    /// controller lives, and an IO queue was not dropped (reset, shutdown).
    /// A driver whose queues live on several threads asks this of each.
    pub fn queue_live(&self, cntlid: u16, qid: u16) -> bool {
        self.controllers
            .get(&cntlid)
            .is_some_and(|c| qid == 0 || c.connected.contains(&qid))
    }

    /// Controllers whose IO queues must close: keep-alive expired, reset,
    /// shut down, or their admin queue gone. (An admin queue closes too when
    /// its controller is no longer `alive`.)
    pub fn take_dropped(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.dropped)
    }

    /// Parked Async Event Requests that ended: (cntlid, cid, completion).
    /// An event or an Abort completes one; a reset or shutdown lets them
    /// go with no completion (None), as hosts cancel their own commands
    /// then and take a late completion for a protocol error.
    pub fn take_events(&mut self) -> Vec<(u16, u16, Option<AdminDone>)> {
        std::mem::take(&mut self.events)
    }

    /// As `take_events`, for controller `cntlid` only: (cid, completion).
    /// Its admin queue's driver takes them after each admin command.
    pub fn take_events_of(&mut self, cntlid: u16) -> Vec<(u16, Option<AdminDone>)> {
        let (mine, others) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| e.0 == cntlid);
        self.events = others;
        mine.into_iter().map(|(_, cid, d)| (cid, d)).collect()
    }

    /// Controller `cntlid`'s I/O queues took commands: its keep-alive timer
    /// restarts, as any admin command restarts it (Identify's CTRATT claims
    /// traffic based keep alive). A host busy with I/O stays alive though
    /// its Keep Alive comes late: SPDK's perf sends one only when its admin
    /// poller wakes, once a second, so a KATO of 1 s expired under load.
    pub fn traffic(&mut self, cntlid: u16, now: Nanos) {
        if let Some(c) = self.controllers.get_mut(&cntlid) {
            c.keep_alive(now);
        }
    }

    /// Expires controllers whose keep-alive timer ran out.
    pub fn tick(&mut self, now: Nanos) {
        let expired: Vec<u16> = self
            .controllers
            .values()
            .filter(|c| c.ka_deadline.is_some_and(|d| d <= now))
            .map(|c| c.cntlid)
            .collect();
        for id in expired {
            self.controllers.remove(&id);
            self.forget(id);
            self.dropped.push(id);
        }
    }

    /// When `tick` next has something to do.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.controllers
            .values()
            .filter_map(|c| c.ka_deadline)
            .min()
    }

    /// A namespace of a subsystem changed: its id goes in each controller's
    /// changed namespace list (log page 04h), and a controller whose host
    /// enabled namespace attribute notices (Async Event Configuration bit
    /// 8) gets an async event (notice, namespace attribute changed, log
    /// 04h), unless one is already reported and its log not yet read.
    pub fn namespace_changed(&mut self, subsys: usize, nsid: u32) {
        let mut told = Vec::new();
        for c in self.controllers.values_mut() {
            if c.subsys != Some(subsys) {
                continue;
            }
            if !c.changed_ns.contains(&nsid) {
                c.changed_ns.push(nsid);
            }
            if c.aec & AEC_NS_ATTRIBUTE == 0 || c.ns_notice_out {
                continue;
            }
            c.ns_notice_out = true;
            let ev = 0x0004_0002; // notice, namespace attribute changed, log 04h
            match c.aers.pop() {
                Some(cid) => told.push((c.cntlid, cid, Some(AdminDone::result(u64::from(ev))))),
                None => c.events.push_back(ev),
            }
        }
        for e in told {
            self.post_event(e);
        }
    }

    /// An admin-queue command (a fabrics Property Get/Set or an admin
    /// command) of controller `cntlid`, with its data from the host.
    pub fn admin(&mut self, cntlid: u16, sqe: &Sqe, now: Nanos) -> AdminDone {
        let limits = self.limits;
        let Some(c) = self.controllers.get_mut(&cntlid) else {
            return AdminDone::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        c.keep_alive(now);
        let opc = sqe.opcode();
        if opc == admin::FABRICS {
            let (done, teardown) = property(c, sqe, &limits);
            if teardown {
                // Reset or shutdown: the controller's IO queues must go
                // (`queue_live` says so to their drivers), and its parked
                // Async Event Requests are let go.
                self.dropped.push(cntlid);
                for cid in c.take_aers().into_iter().chain(c.take_aborts()) {
                    self.post_event((cntlid, cid, None));
                }
                self.io_aborts.retain(|a| a.cntlid != cntlid);
            }
            return done;
        }
        if !c.enabled() {
            return AdminDone::status(Status::COMMAND_SEQUENCE_ERROR);
        }
        match opc {
            admin::IDENTIFY => self.identify(cntlid, sqe),
            admin::GET_LOG_PAGE => self.log_page(cntlid, sqe),
            admin::GET_FEATURES | admin::SET_FEATURES => features(c, sqe, &limits, now),
            admin::KEEP_ALIVE => AdminDone::default(),
            admin::ASYNC_EVENT => match c.async_event(sqe.cid()) {
                Ok(Some(ev)) => AdminDone::result(u64::from(ev)),
                Ok(None) => AdminDone {
                    parked: true,
                    ..AdminDone::default()
                },
                Err(s) => AdminDone::status(s),
            },
            admin::ABORT => self.abort(cntlid, sqe),
            _ => AdminDone::status(Status::INVALID_OPCODE),
        }
    }

    /// Abort (SQID in dword 10 bits 15:0, CID in 31:16). A parked Async
    /// Event Request completes with Command Abort Requested, and the
    /// Abort's dword 0 bit 0 is 0 (aborted). An IO command lives on its IO
    /// queue's driver: the Abort parks until that driver says
    /// (`take_io_aborts_of`, `io_abort_done`). Anything else: "not
    /// aborted" (bit 0 set), which the spec allows of any Abort.
    fn abort(&mut self, cntlid: u16, sqe: &Sqe) -> AdminDone {
        let (sqid, cid) = (sqe.cdw(10) as u16, (sqe.cdw(10) >> 16) as u16);
        let Some(c) = self.controllers.get_mut(&cntlid) else {
            return AdminDone::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        if sqid != 0 && c.connected.contains(&sqid) {
            if !c.park_abort(sqe.cid(), sqid) {
                return AdminDone::status(Status::ABORT_LIMIT);
            }
            self.posted += 1;
            self.io_aborts.push(IoAbort {
                cntlid,
                sqid,
                cid,
                abort_cid: sqe.cid(),
            });
            return AdminDone {
                parked: true,
                ..AdminDone::default()
            };
        }
        if sqid != 0 || !c.abort_aer(cid) {
            return AdminDone::result(1);
        }
        let aborted = AdminDone::status(Status::ABORT_REQUESTED);
        self.post_event((cntlid, cid, Some(aborted)));
        AdminDone::result(0)
    }

    /// The Aborts parked for IO queue `qid` of controller `cntlid`, for
    /// its driver to look for their commands.
    pub fn take_io_aborts_of(&mut self, cntlid: u16, qid: u16) -> Vec<IoAbort> {
        let (mine, others) = std::mem::take(&mut self.io_aborts)
            .into_iter()
            .partition(|a| a.cntlid == cntlid && a.sqid == qid);
        self.io_aborts = others;
        mine
    }

    /// The driver of an IO queue looked for an Abort's command: the
    /// Abort completes (`take_events_of`), dword 0 bit 0 clear when the
    /// command was aborted. Nothing when the Abort was let go meanwhile.
    pub fn io_abort_done(&mut self, cntlid: u16, abort_cid: u16, aborted: bool) {
        let Some(c) = self.controllers.get_mut(&cntlid) else {
            return;
        };
        if c.unpark_abort(abort_cid) {
            let done = AdminDone::result(u64::from(!aborted));
            self.post_event((cntlid, abort_cid, Some(done)));
        }
    }

    /// How many completions and Aborts were ever posted: a driver whose
    /// queues live on several threads tells the others to look when this
    /// moved (`take_events_of`, `take_io_aborts_of`).
    pub fn posted(&self) -> u64 {
        self.posted
    }

    fn post_event(&mut self, e: (u16, u16, Option<AdminDone>)) {
        self.posted += 1;
        self.events.push(e);
    }

    /// Parked completions and Aborts not yet taken: a driver that sees
    /// this grow tells the others to look (`take_events_of`,
    /// `take_io_aborts_of`).
    pub fn mail(&self) -> usize {
        self.events.len() + self.io_aborts.len()
    }

    fn identify(&self, cntlid: u16, sqe: &Sqe) -> AdminDone {
        let Some(c) = self.controllers.get(&cntlid) else {
            return AdminDone::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        let subsys = c.subsys.map(|i| &self.subsystems[i]);
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        match (cns, subsys) {
            (1, _) => AdminDone::data(pages::identify_controller(&CtrlView {
                cntlid,
                subsys,
                limits: &self.limits,
                io_queue_size: c.queue_size,
            })),
            (0, Some(s)) if nsid != 0 => {
                let nn = s.namespaces.iter().map(|n| n.nsid).max().unwrap_or(0);
                if nsid > nn && nsid != u32::MAX {
                    return AdminDone::status(Status::INVALID_NAMESPACE);
                }
                let wp = c.read_only;
                AdminDone::data(pages::identify_namespace(s.namespace(nsid), wp))
            }
            (2, Some(_)) if nsid < 0xFFFF_FFFE => {
                AdminDone::data(pages::active_namespaces(subsys, nsid))
            }
            (3, Some(s)) => match s.namespace(nsid) {
                Some(ns) => AdminDone::data(pages::namespace_descriptors(ns)),
                None => AdminDone::status(Status::INVALID_NAMESPACE),
            },
            (0 | 2 | 3, _) => AdminDone::status(Status::INVALID_NAMESPACE),
            // The NVM command set's own controller structure (CSI 0 in
            // dword 11): SPDK hosts ask for it at every attach. All zero:
            // no Write Zeroes, Verify or Dataset Management limit beyond
            // MDTS, as SPDK's target answers by default.
            (6, Some(_)) if sqe.cdw(11) >> 24 == 0 => AdminDone::data(vec![0; 4096]),
            _ => AdminDone::status(Status::INVALID_FIELD),
        }
    }

    fn log_page(&mut self, cntlid: u16, sqe: &Sqe) -> AdminDone {
        let (cdw10, cdw11) = (sqe.cdw(10), sqe.cdw(11));
        let lid = cdw10 as u8;
        let rae = cdw10 & (1 << 15) != 0;
        let dwords = (u64::from(cdw11 & 0xFFFF) << 16 | u64::from(cdw10 >> 16)) + 1;
        let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
        if offset % 4 != 0 || dwords * 4 > u64::from(self.limits.max_transfer) {
            return AdminDone::status(Status::INVALID_FIELD);
        }
        let Some(c) = self.controllers.get_mut(&cntlid) else {
            return AdminDone::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        let page = match (lid, c.subsys) {
            (0x01, _) => pages::error_log(c.errors),
            (0x02, Some(_)) => pages::smart_log(0, 0),
            (0x03, Some(_)) => pages::firmware_slot_log(),
            (0x04, Some(_)) => {
                let p = pages::changed_namespaces(&c.changed_ns);
                if !rae {
                    // Read: the list clears, and the next change is told.
                    c.changed_ns.clear();
                    c.ns_notice_out = false;
                }
                p
            }
            (0x70, None) => self.discovery_page(cntlid),
            _ => return AdminDone::status(Status::INVALID_LOG_PAGE),
        };
        AdminDone::data(pages::slice_log(&page, offset, (dwords * 4) as usize))
    }

    /// The discovery log as the connected host may see it.
    fn discovery_page(&self, cntlid: u16) -> Vec<u8> {
        let host = self
            .controllers
            .get(&cntlid)
            .map(|c| c.hostnqn.as_str())
            .unwrap_or_default();
        let subs: Vec<&Subsystem> = self.subsystems.iter().filter(|s| s.allows(host)).collect();
        let asqsz = self.limits.max_admin_queue_size;
        pages::discovery_log(&subs, &self.listeners, 1, asqsz)
    }

    /// Removes every controller's state as if each admin queue closed.
    pub fn reset_all(&mut self) {
        let ids: Vec<u16> = self.controllers.keys().copied().collect();
        for id in ids {
            self.queue_closed(id, 0);
        }
    }
}

/// Connect's data fields.
struct Peer<'a> {
    subsys: Option<usize>,
    hostnqn: &'a str,
    hostid: [u8; 16],
    cntlid: u16,
    read_only: bool,
}

/// Property Get or Set (fabrics types 04h and 00h); true when a Property
/// Set reset or shut the controller down.
fn property(c: &mut Controller, sqe: &Sqe, limits: &Limits) -> (AdminDone, bool) {
    let size8 = sqe.0[40] & 7 == 1;
    let ofst = sqe.cdw(11);
    let done = match sqe.fctype() {
        fctype::PROPERTY_GET => match c.get_property(ofst, size8, limits) {
            Ok(v) => AdminDone::result(v),
            Err(s) => AdminDone::status(s),
        },
        fctype::PROPERTY_SET => match c.set_property(ofst, size8, sqe.u64_at(48)) {
            Ok(teardown) => return (AdminDone::default(), teardown),
            Err(s) => AdminDone::status(s),
        },
        fctype::CONNECT => AdminDone::status(Status::COMMAND_SEQUENCE_ERROR),
        _ => AdminDone::status(Status::INVALID_OPCODE),
    };
    (done, false)
}

fn features(c: &mut Controller, sqe: &Sqe, limits: &Limits, now: Nanos) -> AdminDone {
    let cdw10 = sqe.cdw(10);
    let fid = cdw10 as u8;
    let r = if sqe.opcode() == admin::SET_FEATURES {
        if cdw10 & (1 << 31) != 0 {
            return AdminDone::status(Status::FEATURE_NOT_SAVEABLE);
        }
        c.set_feature(fid, sqe.cdw(11), limits, now)
    } else if (cdw10 >> 8) & 7 == 3 {
        // Supported capabilities: changeable, not saveable.
        c.get_feature(fid).map(|_| 0b100)
    } else {
        c.get_feature(fid)
    };
    match r {
        Ok(v) => AdminDone::result(u64::from(v)),
        Err(s) => AdminDone::status(s),
    }
}
