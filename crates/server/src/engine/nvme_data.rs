//! The NVMe/TCP front end's data path (`nvme.rs`): commands waiting for a
//! request slot, a WRITE's H2CData landing in its buffers, and the
//! engine's request for a waiting command; what a queue's action leaves
//! to the engine (`Next`).

use proto::nvme::ctrl::IoOp;
use proto::nvme::queue::{DevOp, Queue};
use proto::nvme::Status;
use proto::Command;

use super::conn::{Conn, Phase};
use super::conns::Conns;
use super::ids::{ConnId, ReqId};
use super::io::IoPath;
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
    match &mut c.phase {
        Phase::Nvme(n) => Some(n),
        _ => None,
    }
}

/// A command that needs a request slot waits its turn (the engine then
/// starts what may start).
pub(super) fn wait(id: ConnId, w: Waiting, conns: &mut Conns) -> Next {
    if let Some(n) = conns.get_mut(id).and_then(nvme_of) {
        n.waiting.push_back(w);
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
    let Some(slot) = nvme_of(c).and_then(|n| n.slots.get(cid)) else {
        return;
    };
    let from = c.rstart + at;
    let Some(src) = c.rbuf.get(from..from + len as usize) else {
        return;
    };
    let req = &mut slots.reqs[slot.index()];
    if req.state != ReqStage::Receiving || req.fault.is_some() {
        // Aborted while its data came: the data is not wanted.
        return;
    }
    if copy_into(&req.iov, datao as usize, src) {
        req.filled += len;
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
        .and_then(|n| n.slots.get(cid))
    else {
        return Next::Done;
    };
    let req = &mut slots.reqs[slot.index()];
    if req.state != ReqStage::Receiving {
        return Next::Done;
    }
    let next = if req.fault.is_some() {
        // An Abort came while its data did: answered as it says.
        ReqStage::Answered
    } else if !ok {
        req.fault = Some(Status::TRANSIENT_TRANSPORT_ERROR);
        ReqStage::Answered
    } else if req.filled == req.len {
        ReqStage::Ready
    } else {
        req.fault = Some(Status::DATA_SGL_LENGTH_INVALID);
        ReqStage::Answered
    };
    slots.set_state(slot, next, &mut io.stats, io.now);
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
