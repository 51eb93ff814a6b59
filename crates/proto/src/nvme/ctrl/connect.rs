//! The Fabrics Connect command (NVMe over Fabrics, Connect command and
//! response): its capsule (QID in dword 10, SQSIZE in dword 11, KATO in
//! dword 12) and its 1024 bytes of data (host id, controller id, subsystem
//! and host NQNs). Hosts build it with [`Connect::sqe`] and
//! [`Connect::data`]; the target reads it with [`Connect::parse`].

use crate::nvme::cmd::{admin, fctype, sgl, Sgl, Sqe, Status};

/// Bytes of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
const CNTLID_AT: usize = 16;
const SUBNQN_AT: usize = 256;
const HOSTNQN_AT: usize = 512;
const NQN_LEN: usize = 256;

/// One Connect command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect<'a> {
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Keep-alive timeout in milliseconds (0: none asked).
    pub kato_ms: u32,
    pub hostid: [u8; 16],
    /// 0xFFFF (or 0xFFFE) on an admin queue: any; an IO queue's controller.
    pub cntlid: u16,
    pub subnqn: &'a str,
    pub hostnqn: &'a str,
}

/// The Connect command's invalid-parameter dword 0: where the bad field is.
pub(super) fn invalid(in_data: bool, offset: u16) -> (Status, u32) {
    (
        Status::CONNECT_INVALID_PARAMETERS,
        (u32::from(in_data) << 16) | u32::from(offset),
    )
}

/// A NUL-terminated NQN field (possibly empty: SPDK's perf sends no
/// host NQN, and SPDK's target takes it).
fn nqn(field: &[u8]) -> Option<&str> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end]).ok()
}

impl<'a> Connect<'a> {
    /// The command capsule, its data described in-capsule (an SGL data
    /// block at offset 0).
    pub fn sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS, cid);
        s.0[4] = fctype::CONNECT;
        s.set_cdw(10, u32::from(self.qid) << 16);
        s.set_cdw(11, u32::from(self.sqsize));
        s.set_cdw(12, self.kato_ms);
        s.set_sgl(Sgl {
            address: 0,
            length: CONNECT_DATA_LEN as u32,
            id: sgl::DATA_BLOCK_OFFSET,
        });
        s
    }

    /// The command's data. NQNs longer than their field are cut short.
    pub fn data(&self) -> Vec<u8> {
        let mut d = vec![0u8; CONNECT_DATA_LEN];
        d[..16].copy_from_slice(&self.hostid);
        d[CNTLID_AT..CNTLID_AT + 2].copy_from_slice(&self.cntlid.to_le_bytes());
        for (at, s) in [(SUBNQN_AT, self.subnqn), (HOSTNQN_AT, self.hostnqn)] {
            let n = s.len().min(NQN_LEN - 1);
            d[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
        }
        d
    }

    /// Reads a Connect from its capsule and data. Err: the status and
    /// completion dword 0 (where an invalid parameter lies).
    pub fn parse(sqe: &Sqe, data: &'a [u8]) -> Result<Connect<'a>, (Status, u32)> {
        let Some(data) = data.get(..CONNECT_DATA_LEN) else {
            return Err((Status::DATA_SGL_LENGTH_INVALID, 0));
        };
        let cdw10 = sqe.cdw(10);
        if cdw10 & 0xFFFF != 0 {
            return Err((Status::CONNECT_INCOMPATIBLE_FORMAT, 0));
        }
        let field = |at: usize| &data[at..at + NQN_LEN];
        let Some(subnqn) = nqn(field(SUBNQN_AT)).filter(|s| !s.is_empty()) else {
            return Err(invalid(true, SUBNQN_AT as u16));
        };
        let Some(hostnqn) = nqn(field(HOSTNQN_AT)) else {
            return Err(invalid(true, HOSTNQN_AT as u16));
        };
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&data[..16]);
        Ok(Connect {
            qid: (cdw10 >> 16) as u16,
            sqsize: sqe.cdw(11) as u16,
            kato_ms: sqe.cdw(12),
            hostid,
            cntlid: u16::from_le_bytes([data[CNTLID_AT], data[CNTLID_AT + 1]]),
            subnqn,
            hostnqn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_host_builds_the_target_reads() {
        let c = Connect {
            qid: 3,
            sqsize: 127,
            kato_ms: 5000,
            hostid: [7; 16],
            cntlid: 42,
            subnqn: "nqn.2026-11.io.iopace:default",
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:h",
        };
        let (sqe, data) = (c.sqe(9), c.data());
        assert_eq!((sqe.cid(), sqe.fctype()), (9, fctype::CONNECT));
        assert_eq!(Connect::parse(&sqe, &data), Ok(c));
        // Short data, a format other than 0, no subsystem NQN.
        assert_eq!(
            Connect::parse(&sqe, &data[..1023]),
            Err((Status::DATA_SGL_LENGTH_INVALID, 0))
        );
        let mut bad = sqe;
        bad.set_cdw(10, (3 << 16) | 1);
        assert_eq!(
            Connect::parse(&bad, &data).map_err(|e| e.0),
            Err(Status::CONNECT_INCOMPATIBLE_FORMAT)
        );
        let c = Connect { subnqn: "", ..c };
        assert_eq!(
            Connect::parse(&sqe, &c.data()),
            Err(invalid(true, SUBNQN_AT as u16))
        );
    }
}
