//! IO commands of the NVM command set: checked against the namespace and
//! the transfer limit, and turned into byte ranges for a device.

use super::{Limits, Namespace};
use crate::nvme::cmd::{io, Sqe, Status};

/// What a device does for an IO command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Flush,
    WriteZeroes,
    /// Dataset Management: its ranges arrive as data; deallocate trims them.
    Dsm {
        deallocate: bool,
    },
}

/// A checked IO command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCmd {
    pub op: IoOp,
    pub nsid: u32,
    /// Byte offset and length on the namespace (Read, Write, Write Zeroes).
    pub offset: u64,
    pub len: u64,
    /// Force unit access.
    pub fua: bool,
    /// Bytes of data the command moves (to the host for Read).
    pub xfer: u32,
}

/// Checks an IO command against the namespaces it may address.
pub fn check_io(sqe: &Sqe, namespaces: &[Namespace], limits: &Limits) -> Result<IoCmd, Status> {
    let opc = sqe.opcode();
    let nsid = sqe.nsid();
    let find = || {
        namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .ok_or(Status::INVALID_NAMESPACE)
    };
    let mut cmd = IoCmd {
        op: IoOp::Flush,
        nsid,
        offset: 0,
        len: 0,
        fua: sqe.cdw(12) & (1 << 30) != 0,
        xfer: 0,
    };
    match opc {
        io::FLUSH => {
            if nsid != u32::MAX {
                find()?;
            }
        }
        io::READ | io::WRITE | io::WRITE_ZEROES => {
            let ns = find()?;
            let (offset, len) = range(sqe, ns)?;
            cmd.offset = offset;
            cmd.len = len;
            cmd.op = match opc {
                io::READ => IoOp::Read,
                io::WRITE => IoOp::Write,
                _ => IoOp::WriteZeroes,
            };
            if cmd.op != IoOp::WriteZeroes {
                if len > u64::from(limits.max_transfer) {
                    return Err(Status::INVALID_FIELD);
                }
                cmd.xfer = len as u32;
            }
            if cmd.op != IoOp::Read && ns.read_only {
                return Err(Status::NAMESPACE_WRITE_PROTECTED);
            }
        }
        io::DSM => {
            let ns = find()?;
            let deallocate = sqe.cdw(11) & (1 << 2) != 0;
            if deallocate && ns.read_only {
                return Err(Status::NAMESPACE_WRITE_PROTECTED);
            }
            cmd.op = IoOp::Dsm { deallocate };
            cmd.xfer = 16 * ((sqe.cdw(10) & 0xFF) + 1);
        }
        _ => return Err(Status::INVALID_OPCODE),
    }
    Ok(cmd)
}

/// SLBA and NLB (0's based) as bytes, inside the namespace.
fn range(sqe: &Sqe, ns: &Namespace) -> Result<(u64, u64), Status> {
    let slba = u64::from(sqe.cdw(10)) | (u64::from(sqe.cdw(11)) << 32);
    let nlb = u64::from(sqe.cdw(12) & 0xFFFF) + 1;
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks => Ok((slba << ns.lba_shift, nlb << ns.lba_shift)),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// A Dataset Management command's ranges (16 bytes each: attributes, LBA
/// count, starting LBA) as byte (offset, length) pairs; empty ones skipped.
pub fn dsm_ranges(data: &[u8], ns: &Namespace) -> Result<Vec<(u64, u64)>, Status> {
    let mut out = Vec::new();
    for r in data.chunks_exact(16) {
        let count = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
        let mut slba = [0u8; 8];
        slba.copy_from_slice(&r[8..16]);
        let slba = u64::from_le_bytes(slba);
        if count == 0 {
            continue;
        }
        match slba.checked_add(count) {
            Some(end) if end <= ns.blocks => {
                out.push((slba << ns.lba_shift, count << ns.lba_shift));
            }
            _ => return Err(Status::LBA_OUT_OF_RANGE),
        }
    }
    Ok(out)
}
