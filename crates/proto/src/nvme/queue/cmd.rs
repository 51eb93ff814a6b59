//! A command's life on its queue. `State` is where it is; `Cmd::advance`
//! is the one function that moves it (`Life::step` finds the command). `Life` holds what a command's life
//! moves: the queue's commands, its phase (a Connect binds it), its send
//! side (`tx.rs`) and the actions for its driver:
//!
//! ```text
//! New --Start--> Admitting --Admitted--> Receiving --DataIn--> Ready
//!   \                    \________________________________/   |
//!    \________________________________________________________/|
//!                                                   Ready -> Executing
//! Executing --Done--> (completion sent, gone)
//! Executing --Park--> Parked --Done--> (completion sent, gone)
//!                      Parked --Release--> (gone, no completion)
//! ```
//!
//! A data command waits in `Admitting` until the driver's pacer admits its
//! buffers; only then does a WRITE's R2T go out, so write data never waits
//! in a socket holding a buffer. `Ready` is transient: `step` executes it.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use super::tx::Tx;
use super::Phase;
use crate::nvme::cmd::{admin, fctype, sgl, Sqe, Status};
use crate::nvme::ctrl::{check_io, dsm_ranges, Connected, IoCmd, IoOp, Limits, ADMIN_IN_CAPSULE};
use crate::nvme::decode::Fatal;
use crate::nvme::pdu::fes;

/// What the queue asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fabrics Connect: `Target::connect`, then `Queue::connected`.
    Connect { cid: u16, sqe: Sqe, data: Vec<u8> },
    /// An admin-queue command: `Target::admin`, then `Queue::admin_done`.
    Admin { cid: u16, cntlid: u16, sqe: Sqe },
    /// A data command waits for the pacer: `Queue::admit` once `len`
    /// bytes of buffers are its own.
    Admit { cid: u16, len: u32, write: bool },
    /// Device IO on namespace `nsid`, then `Queue::io_done`.
    Io { cid: u16, nsid: u32, op: DevOp },
    /// The host gave up a parked Async Event Request:
    /// `Target::drop_async_event`.
    DropAer { cid: u16, cntlid: u16 },
    /// Send what is queued, then close the connection.
    Close,
    /// An external WRITE's data (`Queue::external`): `len` bytes at offset
    /// `datao` of the command's data lie at `at` in the buffer `receive`
    /// was given, until `receive` returns.
    Data {
        cid: u16,
        datao: u32,
        at: usize,
        len: u32,
    },
    /// An external WRITE's data is all in; `ok` is false when a data
    /// digest failed (complete it with a transient transport error).
    DataIn { cid: u16, ok: bool },
}

/// Where an external WRITE's data comes from (`Queue::request_data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataStart {
    /// It came in the capsule: here it is.
    InCapsule(Vec<u8>),
    /// An R2T went out: `Action::Data` brings it.
    Requested,
    /// No such command waits for admission.
    Gone,
}

/// A device operation, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevOp {
    Read {
        offset: u64,
        len: u64,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    Trim {
        ranges: Vec<(u64, u64)>,
    },
}

/// What a command is, for where it executes. Only a Connect's and an
/// admin command's SQE is needed again (their actions carry it), so only
/// they keep it, boxed: an IO command's `Cmd` stays small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    Connect(Box<Sqe>),
    Admin(Box<Sqe>),
    Io(IoCmd),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    New,
    Admitting,
    Receiving { ttag: u16, got: u32 },
    Ready,
    Executing,
    Parked,
}

/// Events that move a command. A completion's data for the host does not
/// ride in its event: it goes straight to `Life::finish` (`Life::step_data`),
/// so the events and `After` stay small and are passed in registers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ev {
    Start,
    Admitted,
    DataIn,
    Done(Status, u64),
    Park,
    /// A parked command let go with no completion (a controller reset).
    Release,
}

#[derive(Debug)]
pub(super) struct Cmd {
    kind: Kind,
    /// Bytes of data the command moves.
    pub(super) xfer: u32,
    /// Data moves host to controller.
    h2c: bool,
    /// Data from the host so far (in-capsule or H2CData).
    pub(super) data: Vec<u8>,
    pub(super) bad_digest: bool,
    /// A READ or WRITE whose data and completion the driver handles.
    pub(super) external: bool,
    state: State,
}

/// What a command's move leaves to its queue (`Cmd::advance`).
#[derive(Debug, Clone, Copy)]
enum After {
    Wait,
    /// It is Ready: hand it to the target or the device.
    Execute,
    /// Send its data and completion; it is gone.
    Finish(Status, u64),
    /// It is gone, with no completion.
    Remove,
}

/// The parts of a queue a command's life moves (`Queue::life` lends them).
pub(super) struct Life<'q> {
    pub cmds: &'q mut FxHashMap<u16, Cmd>,
    pub phase: &'q mut Phase,
    pub tx: &'q mut Tx,
    pub actions: &'q mut Vec<Action>,
    pub limits: &'q Limits,
    /// Data commands go without asking the driver to admit them.
    pub auto_admit: bool,
    /// READs and WRITEs are the driver's (`Queue::external`).
    pub external: bool,
}

impl Cmd {
    /// A new command, with its in-capsule data if it came with some; its
    /// READ or WRITE is the driver's on an `external` queue.
    fn new(kind: Kind, xfer: u32, h2c: bool, data: Option<&[u8]>, external: bool) -> Cmd {
        let external =
            external && matches!(&kind, Kind::Io(io) if matches!(io.op, IoOp::Read | IoOp::Write));
        Cmd {
            external,
            kind,
            xfer,
            h2c,
            data: data.map_or_else(Vec::new, <[u8]>::to_vec),
            bad_digest: false,
            state: State::New,
        }
    }

    /// (TTAG, bytes so far) while an R2T's data is coming.
    pub(super) fn receiving(&self) -> Option<(u16, u32)> {
        match self.state {
            State::Receiving { ttag, got } => Some((ttag, got)),
            _ => None,
        }
    }

    pub(super) fn set_received(&mut self, n: u32) {
        if let State::Receiving { got, .. } = &mut self.state {
            *got = n;
        }
    }

    /// The IO it is, if an IO command.
    pub(super) fn io(&self) -> Option<IoCmd> {
        match self.kind {
            Kind::Io(io) => Some(io),
            _ => None,
        }
    }

    pub(super) fn at_device(&self) -> bool {
        self.state == State::Executing && matches!(self.kind, Kind::Io(_))
    }

    /// Moves command `cid` on by `ev`: the one place a command changes
    /// state. What needs the queue's map (executing a Ready command,
    /// finishing or dropping one) is left to the caller (`Life::after`).
    fn advance(
        &mut self,
        cid: u16,
        ev: Ev,
        auto_admit: bool,
        actions: &mut Vec<Action>,
        tx: &mut Tx,
    ) -> After {
        let pacing =
            self.external || (!auto_admit && self.xfer > 0 && matches!(self.kind, Kind::Io(_)));
        let wants_data = self.h2c && self.data.len() < self.xfer as usize;
        let (xfer, h2c, bad, external) = (self.xfer, self.h2c, self.bad_digest, self.external);
        let next = match (self.state, ev) {
            (State::New, Ev::Start) if pacing => {
                actions.push(Action::Admit {
                    cid,
                    len: xfer,
                    write: h2c,
                });
                State::Admitting
            }
            (State::New, Ev::Start) | (State::Admitting, Ev::Admitted) if wants_data => {
                self.data.reserve_exact(xfer as usize);
                let ttag = tx.send_r2t(cid, xfer);
                State::Receiving { ttag, got: 0 }
            }
            (State::New, Ev::Start) | (State::Admitting, Ev::Admitted) => State::Ready,
            (State::Receiving { .. }, Ev::DataIn) if external => {
                actions.push(Action::DataIn { cid, ok: !bad });
                State::Executing
            }
            (State::Receiving { .. }, Ev::DataIn) if bad => {
                return After::Finish(Status::TRANSIENT_TRANSPORT_ERROR, 0);
            }
            (State::Receiving { .. }, Ev::DataIn) => State::Ready,
            (State::Executing, Ev::Park) => State::Parked,
            (State::Executing | State::Parked, Ev::Done(s, r)) => return After::Finish(s, r),
            (State::Parked, Ev::Release) => return After::Remove,
            _ => return After::Wait,
        };
        self.state = next;
        if next == State::Ready {
            After::Execute
        } else {
            After::Wait
        }
    }
}

/// Data direction from an opcode (or fabrics type): bits 1:0.
fn h2c_opcode(op: u8) -> bool {
    op & 3 == 1
}

impl Life<'_> {
    /// The Connect this queue made, once made.
    fn bound(&self) -> Option<&Connected> {
        match &*self.phase {
            Phase::Bound(c) => Some(c),
            _ => None,
        }
    }

    /// The most commands this queue may hold.
    fn depth(&self) -> usize {
        match &*self.phase {
            Phase::Bound(c) => usize::from(c.queue_size),
            _ => 1,
        }
    }

    /// Appends a completion for `cid`.
    fn respond(&mut self, cid: u16, status: Status, result: u64) {
        let qid = self.bound().map_or(0, |c| c.qid);
        self.tx.respond(cid, status, result, qid);
    }

    /// A command capsule arrived. The command is checked before the map
    /// is probed (the checks read nothing of it), so an id is looked up
    /// once: the vacant entry takes the new command, already started.
    pub(super) fn capsule(&mut self, sqe: Sqe, data: &[u8], digest_ok: bool) -> Result<(), Fatal> {
        let depth = self.depth();
        self.tx.consumed(depth);
        let cid = sqe.cid();
        let checked = self.classify(&sqe).and_then(|(k, x, h)| {
            let icd = self.check_sgl(&sqe, &k, x, h, data)?;
            Ok((k, x, h, icd))
        });
        let mut held = self.cmds.len();
        let slot = match self.cmds.entry(cid) {
            Entry::Vacant(v) => Some(v),
            Entry::Occupied(o) if o.get().state == State::Parked => {
                // A host that reuses a parked Async Event Request's id gave
                // it up (SPDK's host does at shutdown): the new command takes it.
                o.remove();
                held -= 1;
                None
            }
            Entry::Occupied(_) => {
                self.respond(cid, Status::CID_CONFLICT, 0);
                return Ok(());
            }
        };
        if slot.is_none() {
            // The phase, not `bound()`: the map stays borrowed for `slot`.
            let cntlid = match &*self.phase {
                Phase::Bound(b) => b.cntlid,
                _ => 0,
            };
            self.actions.push(Action::DropAer { cid, cntlid });
        }
        if held >= depth {
            // More commands than the queue holds: the host broke flow control.
            return Err(Fatal {
                fes: fes::PDU_SEQUENCE_ERROR,
                fei: 0,
            });
        }
        match checked {
            Err(s) => self.respond(cid, s, 0),
            Ok(_) if !digest_ok => self.respond(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0),
            Ok((kind, xfer, h2c, in_capsule)) => {
                let data = in_capsule.then_some(data);
                let mut c = Cmd::new(kind, xfer, h2c, data, self.external);
                let (actions, tx) = (&mut *self.actions, &mut *self.tx);
                let after = c.advance(cid, Ev::Start, self.auto_admit, actions, tx);
                match slot {
                    Some(v) => {
                        v.insert(c);
                    }
                    None => {
                        self.cmds.insert(cid, c);
                    }
                }
                self.after(cid, after, Vec::new());
            }
        }
        Ok(())
    }

    /// What the command is, how much data it moves and which way.
    fn classify(&self, sqe: &Sqe) -> Result<(Kind, u32, bool), Status> {
        let opc = sqe.opcode();
        let fabrics = opc == admin::FABRICS;
        let connect = fabrics && sqe.fctype() == fctype::CONNECT;
        let sgl_len = sqe.sgl().length;
        match &*self.phase {
            Phase::Unbound if connect => Ok((Kind::Connect(Box::new(*sqe)), sgl_len, true)),
            Phase::Bound(b) if b.qid == 0 && !connect => {
                let dir = if fabrics { sqe.fctype() } else { opc };
                let h2c = h2c_opcode(dir);
                let xfer = if dir & 3 == 0 { 0 } else { sgl_len };
                if h2c && xfer > 0 && sqe.sgl().id != sgl::DATA_BLOCK_OFFSET {
                    return Err(Status::INVALID_FIELD); // no admin command needs it
                }
                Ok((Kind::Admin(Box::new(*sqe)), xfer, h2c))
            }
            Phase::Bound(b) if !fabrics => {
                let io = check_io(sqe, &b.namespaces, self.limits)?;
                let h2c = matches!(io.op, IoOp::Write | IoOp::Dsm { .. });
                Ok((Kind::Io(io), io.xfer, h2c))
            }
            Phase::Bound(_) if fabrics && !connect => Err(Status::INVALID_OPCODE),
            _ => Err(Status::COMMAND_SEQUENCE_ERROR),
        }
    }

    /// Checks the SGL and any in-capsule data; true if the data came in it.
    fn check_sgl(
        &self,
        sqe: &Sqe,
        kind: &Kind,
        xfer: u32,
        h2c: bool,
        data: &[u8],
    ) -> Result<bool, Status> {
        if sqe.psdt() == 0 {
            return Err(Status::INVALID_FIELD); // PRPs: fabrics need SGLs
        }
        if xfer == 0 || !h2c {
            // A command that moves no data to the controller carries none.
            if !data.is_empty() {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            let d = sqe.sgl();
            if xfer > 0 && d.id != sgl::TRANSPORT_DATA_BLOCK {
                return Err(Status::SGL_TYPE_INVALID);
            }
            if xfer > 0 && d.length < xfer {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            return Ok(false);
        }
        let d = sqe.sgl();
        if d.length != xfer {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        match d.id {
            sgl::DATA_BLOCK_OFFSET => {
                let io = matches!(kind, Kind::Io(_));
                let max = if io {
                    self.limits.in_capsule
                } else {
                    ADMIN_IN_CAPSULE
                };
                if d.address != 0 {
                    return Err(Status::SGL_OFFSET_INVALID);
                }
                if xfer > max || data.len() != xfer as usize {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                Ok(true)
            }
            sgl::TRANSPORT_DATA_BLOCK if data.is_empty() => Ok(false),
            sgl::TRANSPORT_DATA_BLOCK => Err(Status::DATA_SGL_LENGTH_INVALID),
            _ => Err(Status::SGL_TYPE_INVALID),
        }
    }

    /// Moves command `cid` on by `ev` until it waits (`Cmd::advance`).
    /// Events for commands no longer here (after an abort) or out of turn
    /// are ignored.
    pub(super) fn step(&mut self, cid: u16, ev: Ev) {
        self.step_data(cid, ev, Vec::new());
    }

    /// `step`, with the data for the host that a `Done` completes with.
    pub(super) fn step_data(&mut self, cid: u16, ev: Ev, data: Vec<u8>) {
        let Some(c) = self.cmds.get_mut(&cid) else {
            return;
        };
        let after = c.advance(cid, ev, self.auto_admit, self.actions, self.tx);
        self.after(cid, after, data);
    }

    /// What a move of command `cid` left to do (`data`: a `Done`'s).
    fn after(&mut self, cid: u16, after: After, data: Vec<u8>) {
        match after {
            After::Wait => {}
            After::Execute => self.execute(cid),
            After::Finish(s, r) => self.finish(cid, s, r, data),
            After::Remove => {
                self.cmds.remove(&cid);
            }
        }
    }

    /// An external WRITE's buffers are the driver's: its data, from the
    /// capsule, or asked for with an R2T.
    pub fn request_data(&mut self, cid: u16) -> DataStart {
        let Some(c) = self.cmds.get_mut(&cid) else {
            return DataStart::Gone;
        };
        if !c.external || c.state != State::Admitting {
            return DataStart::Gone;
        }
        if !c.h2c || c.data.len() == c.xfer as usize {
            c.state = State::Executing;
            return DataStart::InCapsule(std::mem::take(&mut c.data));
        }
        let xfer = c.xfer;
        let ttag = self.tx.send_r2t(cid, xfer);
        if let Some(c) = self.cmds.get_mut(&cid) {
            c.state = State::Receiving { ttag, got: 0 };
        }
        DataStart::Requested
    }

    /// The driver aborted command `cid` while it waited (an Abort found it
    /// before its device operation): it completes with Command Abort
    /// Requested and is gone. False when no such command is here, or its
    /// data is on its way (an R2T out: H2CData still comes for it).
    pub fn abort_cmd(&mut self, cid: u16) -> bool {
        if self.cmds.get(&cid).is_none_or(|c| c.receiving().is_some()) {
            return false;
        }
        self.cmds.remove(&cid);
        self.respond(cid, Status::ABORT_REQUESTED, 0);
        true
    }

    /// Hands a Ready command to the target or the device.
    fn execute(&mut self, cid: u16) {
        let Some(c) = self.cmds.get_mut(&cid) else {
            return;
        };
        c.state = State::Executing;
        let action = match &c.kind {
            Kind::Connect(sqe) => {
                let sqe = **sqe;
                *self.phase = Phase::Connecting;
                Action::Connect {
                    cid,
                    sqe,
                    data: std::mem::take(&mut c.data),
                }
            }
            Kind::Admin(sqe) => {
                let sqe = **sqe;
                let cntlid = self.bound().map_or(0, |b| b.cntlid);
                Action::Admin { cid, cntlid, sqe }
            }
            Kind::Io(io) => {
                let io = *io;
                let data = std::mem::take(&mut c.data);
                match dev_op(&io, data, self.bound().map(|b| &b.namespaces[..])) {
                    Ok(Some(op)) => Action::Io {
                        cid,
                        nsid: io.nsid,
                        op,
                    },
                    Ok(None) => return self.finish(cid, Status::SUCCESS, 0, Vec::new()),
                    Err(s) => return self.finish(cid, s, 0, Vec::new()),
                }
            }
        };
        self.actions.push(action);
    }

    /// Sends a command's data (for the host) and completion; it is gone.
    fn finish(&mut self, cid: u16, status: Status, result: u64, mut data: Vec<u8>) {
        let Some(c) = self.cmds.remove(&cid) else {
            return;
        };
        if status.is_success() && !c.h2c && c.xfer > 0 {
            data.resize(c.xfer as usize, 0);
            self.tx.send_data(cid, &data);
        }
        self.respond(cid, status, result);
    }
}

/// The device operation for a checked IO command with its data; None when
/// there is nothing for the device to do (a DSM without deallocate).
fn dev_op(
    io: &IoCmd,
    data: Vec<u8>,
    nss: Option<&[crate::nvme::ctrl::Namespace]>,
) -> Result<Option<DevOp>, Status> {
    Ok(Some(match io.op {
        IoOp::Read => DevOp::Read {
            offset: io.offset,
            len: io.len,
        },
        IoOp::Write => DevOp::Write {
            offset: io.offset,
            data,
            fua: io.fua,
        },
        IoOp::Flush => DevOp::Flush,
        IoOp::WriteZeroes => DevOp::WriteZeroes {
            offset: io.offset,
            len: io.len,
        },
        IoOp::Dsm { deallocate: false } => return Ok(None),
        IoOp::Dsm { deallocate: true } => {
            let ns = nss
                .and_then(|n| n.iter().find(|n| n.nsid == io.nsid))
                .ok_or(Status::INVALID_NAMESPACE)?;
            let ranges = dsm_ranges(&data, ns)?;
            if ranges.is_empty() {
                return Ok(None);
            }
            DevOp::Trim { ranges }
        }
    }))
}
