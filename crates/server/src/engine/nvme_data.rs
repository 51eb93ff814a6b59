//! The NVMe/TCP front end's data path (`nvme.rs`): commands waiting for a
//! request slot, a WRITE's H2CData landing in its buffers, and the
//! engine's request for a waiting command; what a queue's action leaves
//! to the engine (`Next`). Below the request machine's calls into the
//! front end too: a WRITE's data wanted once its buffers are in, a reply
//! encoded, a queue closed (the machine, `request.rs`, sits below
//! `nvme.rs`, which drives it).

use proto::nvme::ctrl::IoOp;
use proto::nvme::queue::{DataStart, DevOp, Queue};
use proto::nvme::Status;
use proto::Command;

use super::conn::Conn;
use super::conn_state::{Input, Phase};
use super::conns::Conns;
use super::ids::{ConnId, ReqId};
use super::io_path::IoPath;
use super::nvme_conn::{NvmeConn, Waiting};
use super::slots::Slots;
use super::states::ReqStage;

/// What a queue's action leaves to the engine.
#[must_use]
pub enum Next {
    Done,
    /// A command waits for a request slot: start what may start.
    StartWaiting,
    /// A WRITE's data is in: advance its request.
    Advance(ReqId),
    /// The queue closed (a fatal PDU): its input ends.
    InputEnded,
}

/// The NVMe connection behind `c`, if it is one.
pub(super) fn nvme_of(c: &mut Conn) -> Option<&mut NvmeConn> {
    match c.phase_mut() {
        Phase::Nvme(n) => Some(n),
        _ => None,
    }
}

/// A command that needs a request slot waits its turn (the engine then
/// starts what may start).
pub(super) fn wait(id: ConnId, w: Waiting, conns: &mut Conns) -> Next {
    if let Some(n) = conns.get_mut(id).and_then(nvme_of) {
        n.wait(w);
    }
    Next::StartWaiting
}

/// H2CData bytes for `cid` at `at` of the bytes given to the queue.
pub(super) fn data(
    id: ConnId,
    cid: u16,
    datao: u32,
    at: usize,
    len: u32,
    conns: &mut Conns,
    slots: &mut Slots,
) {
    let Some(c) = conns.get_mut(id) else {
        return;
    };
    let Some(slot) = nvme_of(c).and_then(|n| n.slots().get(cid)) else {
        return;
    };
    let Some(src) = c.unparsed_at(at, len as usize) else {
        return;
    };
    let req = &mut slots[slot];
    if req.state() != ReqStage::Receiving || req.fault().is_some() {
        // Aborted while its data came: the data is not wanted.
        return;
    }
    if copy_into(req.iov(), datao as usize, src) {
        req.payload_in(len);
    }
}

/// A WRITE's data is all in: to the device (or answered, when a data
/// digest failed).
pub(super) fn data_in(
    id: ConnId,
    cid: u16,
    ok: bool,
    conns: &mut Conns,
    slots: &mut Slots,
    io: &mut IoPath,
) -> Next {
    let Some(slot) = conns
        .get_mut(id)
        .and_then(nvme_of)
        .and_then(|n| n.slots().get(cid))
    else {
        return Next::Done;
    };
    let req = &mut slots[slot];
    if req.state() != ReqStage::Receiving {
        return Next::Done;
    }
    let next = if req.fault().is_some() {
        // An Abort came while its data did: answered as it says.
        ReqStage::Answered
    } else if !ok {
        req.set_fault(Status::TRANSIENT_TRANSPORT_ERROR);
        ReqStage::Answered
    } else if req.filled() == req.len() {
        ReqStage::Ready
    } else {
        req.set_fault(Status::DATA_SGL_LENGTH_INVALID);
        ReqStage::Answered
    };
    let now = io.now();
    slots.set_state(slot, next, io.stats_mut(), now);
    Next::Advance(slot)
}

/// A command id, its request, and further byte ranges (`nvme_command`).
pub(super) type NvmeRequest = (u16, proto::Request, Vec<(u64, u64)>);

/// The engine's request for a waiting command: its id, an NBD-shaped
/// request (the command, flags, byte offset and length) and any further
/// byte ranges (a deallocate's). None when the queue no longer has it.
pub(super) fn nvme_command(q: &Queue, w: Waiting) -> Option<NvmeRequest> {
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
pub(super) fn copy_into(iov: &[libc::iovec], mut at: usize, mut src: &[u8]) -> bool {
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

/// An NVMe status for a device error (an errno).
fn status_of(errno: u32) -> Status {
    match errno as i32 {
        libc::EPERM | libc::EROFS => Status::NAMESPACE_WRITE_PROTECTED,
        libc::ENOSPC => Status::generic(0x81), // capacity exceeded
        libc::EINVAL => Status::INVALID_FIELD,
        _ => Status::INTERNAL_ERROR,
    }
}

/// A WRITE holds its buffers: its in-capsule data lands in them, or
/// its R2T goes out.
pub(super) fn data_wanted(
    id: ReqId,
    conns: &mut Conns,
    slots: &mut Slots,
    io: &mut IoPath,
) -> ReqStage {
    let req = &slots[id];
    let (conn, cid) = (req.conn(), req.cookie() as u16);
    let Some(c) = conns.get_mut(conn) else {
        return ReqStage::Answered;
    };
    if c.input() != Input::Pdus {
        // Input ended: no data will come.
        slots[id].set_fault(Status::ABORTED_SQ_DELETED);
        return ReqStage::Answered;
    }
    let Some(n) = nvme_of(c) else {
        return ReqStage::Answered;
    };
    match n.queue_mut().request_data(cid) {
        DataStart::InCapsule(data) => {
            let req = &mut slots[id];
            // One copy fewer: the device takes it from the capsule.
            let Err(data) = req.lend_payload(data) else {
                return ReqStage::Ready;
            };
            if copy_into(req.iov(), 0, &data) {
                req.set_filled(data.len() as u32);
                ReqStage::Ready
            } else {
                req.set_fault(Status::DATA_SGL_LENGTH_INVALID);
                ReqStage::Answered
            }
        }
        DataStart::Requested => {
            // The R2T is in the queue's output.
            io.touch(conn);
            ReqStage::Receiving
        }
        DataStart::Gone => {
            slots[id].set_fault(Status::ABORTED_SQ_DELETED);
            ReqStage::Answered
        }
    }
}

/// READ `id`'s reply carries a data digest, computed before the send:
/// bytes lent from a RAM bdev that a WRITE changed in between failed
/// it at the host (SPDK perf, randrw with -H -I), so such a READ is
/// copied into its buffers instead.
pub(super) fn digests_read_data(id: ReqId, conns: &mut Conns, slots: &Slots) -> bool {
    let Some(conn) = slots.get(id).map(|r| r.conn()) else {
        return false;
    };
    conns
        .get_mut(conn)
        .and_then(nvme_of)
        .is_some_and(|n| n.queue().data_digest())
}

/// Encodes an answered request's reply: a READ's C2HData head before
/// its data, then its data digest and completion.
pub(super) fn reply(id: ReqId, conns: &mut Conns, slots: &mut Slots) {
    let req = &mut slots[id];
    let (conn, cid) = (req.conn(), req.cookie() as u16);
    let status = match (req.fault(), req.error()) {
        (Some(s), _) => s,
        (None, 0) => Status::SUCCESS,
        (None, e) => status_of(e),
    };
    req.clear_reply();
    let Some(n) = conns.get_mut(conn).and_then(nvme_of) else {
        return;
    };
    n.slots_mut().remove(cid);
    if req.command() == Command::Read && status.is_success() && req.len() > 0 {
        // The data PDU completes it (SUCCESS flag, as SPDK's target
        // sends by default): no CapsuleResp follows.
        let len = req.len();
        n.queue().c2h_head(cid, len, true, req.hdr_mut());
        let digest = n.queue().data_digest().then(|| {
            req.iov().iter().fold(0u32, |crc, v| {
                // SAFETY: the iovecs cover the READ's data, in buffers
                // (or a bdev's memory) it holds until its reply is sent.
                let b = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
                proto::nvme::pdu::crc32c_append(crc, b)
            })
        });
        req.data_reply_with(digest);
        n.queue_mut().finish_silently(cid);
    } else {
        n.queue_mut().finish_external(cid, status, req.hdr_mut());
    }
}

/// The requests of the connection's commands holding a slot (its input
/// ended: those still receiving their data never get it).
pub(super) fn requests_of(id: ConnId, conns: &mut Conns) -> Vec<ReqId> {
    let Some(n) = conns.get_mut(id).and_then(nvme_of) else {
        return Vec::new();
    };
    n.slots().in_order().collect()
}

/// The connection closed: its queue leaves its controller, its waiting
/// commands are dropped (those with slots were aborted by `close`).
pub(super) fn closed(id: ConnId, conns: &mut Conns, slots: &mut Slots, io: &IoPath) {
    let Some(n) = conns.get_mut(id).and_then(nvme_of) else {
        return;
    };
    let bound = n.close();
    slots.forget_waiter(id);
    if let (Some((cntlid, qid, _)), Some(t)) = (bound, io.catalog().nvme.as_ref()) {
        // Aborts parked for its commands complete: mail.
        t.with(|t| t.queue_closed(cntlid, qid));
    }
}

/// `n` bytes of the H2CData arriving for WRITE `r` on `id` landed in its
/// buffers, received straight into them (`RecvOp::H2c`): the queue counts
/// them (its data digest reads them there), and so does the request.
pub(super) fn landed(id: ConnId, r: ReqId, n: usize, conns: &mut Conns, slots: &mut Slots) {
    let Some(q) = conns.get_mut(id).and_then(nvme_of) else {
        return;
    };
    // The recv was posted for this PDU's data (`NvmeConn::h2c_target`),
    // and nothing else read the connection while it was out.
    let (cid, at, due) = q.queue().inflow().expect("an H2CData arriving");
    debug_assert_eq!(q.slots().get(cid), Some(r));
    let req = &mut slots[r];
    let (buf, room) = req.data_at(at).expect("inside the WRITE's data");
    assert!(
        n <= room.min(due as usize),
        "{n} bytes landed past the target"
    );
    // SAFETY: the recv wrote `n` bytes at `buf`, inside a buffer the
    // request holds (its release waits for the recv).
    let data = unsafe { std::slice::from_raw_parts(buf.cast_const(), n) };
    q.queue_mut().landed(data);
    req.payload_in(n as u32);
}
