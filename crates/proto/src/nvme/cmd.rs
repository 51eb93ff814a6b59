//! NVMe submission and completion queue entries, SGL descriptors, opcodes
//! and status codes, as NVMe over Fabrics carries them in capsules.

/// Admin command opcodes.
pub mod admin {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics commands (either queue), their type in byte 4.
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set IO opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Fabrics command types (FCTYPE).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
}

/// A status: type (SCT) and code (SC), with Do Not Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        dnr: false,
    };
    pub const INVALID_OPCODE: Status = Status::generic(0x01);
    pub const INVALID_FIELD: Status = Status::generic(0x02);
    pub const CID_CONFLICT: Status = Status::generic(0x03);
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const ABORT_REQUESTED: Status = Status::generic(0x07);
    pub const ABORTED_SQ_DELETED: Status = Status::generic(0x08);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0B);
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(0x0C);
    pub const INVALID_SGL_DESCRIPTOR: Status = Status::generic(0x0D);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0F);
    pub const SGL_TYPE_INVALID: Status = Status::generic(0x11);
    pub const SGL_OFFSET_INVALID: Status = Status::generic(0x16);
    pub const NAMESPACE_WRITE_PROTECTED: Status = Status::generic(0x20);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status {
        sct: 0,
        sc: 0x22,
        dnr: false,
    };
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80);
    pub const INVALID_QUEUE_ID: Status = Status::specific(0x01);
    pub const INVALID_QUEUE_SIZE: Status = Status::specific(0x02);
    pub const ABORT_LIMIT: Status = Status::specific(0x03);
    pub const ASYNC_EVENT_LIMIT: Status = Status::specific(0x05);
    pub const INVALID_LOG_PAGE: Status = Status::specific(0x09);
    pub const FEATURE_NOT_SAVEABLE: Status = Status::specific(0x0D);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::specific(0x80);
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::specific(0x82);
    pub const CONNECT_INVALID_HOST: Status = Status::specific(0x84);

    /// A generic command status (SCT 0), do not retry.
    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: 0,
            sc,
            dnr: true,
        }
    }

    /// A command specific status (SCT 1), do not retry.
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: true,
        }
    }

    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The status field's bits 15:1 (phase bit 0 left clear).
    pub fn to_field(self) -> u16 {
        (u16::from(self.sc) << 1) | (u16::from(self.sct & 7) << 9) | (u16::from(self.dnr) << 15)
    }

    pub fn from_field(v: u16) -> Status {
        Status {
            sc: (v >> 1) as u8,
            sct: ((v >> 9) & 7) as u8,
            dnr: v & 0x8000 != 0,
        }
    }
}

/// A 64-byte submission queue entry, kept as its bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opc", &self.opcode())
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .finish_non_exhaustive()
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | (u64::from(le32(b, at + 4)) << 32)
}

impl Sqe {
    /// An entry with opcode and command id set, the rest zero, SGL data.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut b = [0u8; 64];
        b[0] = opcode;
        b[1] = 0x40; // PSDT 01: SGL
        b[2..4].copy_from_slice(&cid.to_le_bytes());
        Sqe(b)
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// PRP or SGL for data transfer (bits 7:6 of byte 1): fabrics need SGL.
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// Fused operation bits.
    pub fn fuse(&self) -> u8 {
        self.0[1] & 3
    }

    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }

    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }

    /// A fabrics command's type (byte 4, where NSID lies otherwise).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Command dword `n` (0..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, 4 * (n & 15))
    }

    pub fn set_cdw(&mut self, n: usize, v: u32) {
        let at = 4 * (n & 15);
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    pub fn set_nsid(&mut self, nsid: u32) {
        self.set_cdw(1, nsid);
    }

    /// Little-endian u64 at byte `at` (e.g. a Property Set value at 48).
    pub fn u64_at(&self, at: usize) -> u64 {
        if at + 8 <= 64 {
            le64(&self.0, at)
        } else {
            0
        }
    }

    /// The first SGL descriptor (bytes 24..40).
    pub fn sgl(&self) -> Sgl {
        Sgl::from_bytes(&self.0[24..40])
    }

    pub fn set_sgl(&mut self, sgl: Sgl) {
        self.0[24..40].copy_from_slice(&sgl.to_bytes());
    }
}

/// SGL descriptor type/subtype bytes NVMe/TCP uses.
pub mod sgl {
    /// Data block, offset into the capsule's in-capsule data.
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Transport data block: data moves in H2CData/C2HData PDUs.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5A;
}

/// One 16-byte SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sgl {
    pub address: u64,
    pub length: u32,
    /// Type (bits 7:4) and subtype (bits 3:0).
    pub id: u8,
}

impl Sgl {
    pub fn from_bytes(b: &[u8]) -> Sgl {
        if b.len() < 16 {
            return Sgl::default();
        }
        Sgl {
            address: le64(b, 0),
            length: le32(b, 8),
            id: b[15],
        }
    }

    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.address.to_le_bytes());
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b[15] = self.id;
        b
    }
}

/// A completion queue entry (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific dwords 0 and 1 (a Property Get's value uses both).
    pub result: u64,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.to_field().to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Cqe {
        if b.len() < 16 {
            return Cqe::default();
        }
        Cqe {
            result: le64(b, 0),
            sqhd: le16(b, 8),
            sqid: le16(b, 10),
            cid: le16(b, 12),
            status: Status::from_field(le16(b, 14)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_round_trips() {
        for s in [
            Status::SUCCESS,
            Status::LBA_OUT_OF_RANGE,
            Status::CONNECT_INVALID_HOST,
            Status::TRANSIENT_TRANSPORT_ERROR,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        // LBA out of range: SC 0x80 in bits 8:1, DNR in bit 15.
        assert_eq!(Status::LBA_OUT_OF_RANGE.to_field(), 0x8100);
    }

    #[test]
    fn sqe_fields() {
        let mut s = Sqe::new(io::READ, 0xBEEF);
        s.set_nsid(1);
        s.set_cdw(10, 8);
        s.set_sgl(Sgl {
            address: 0,
            length: 4096,
            id: sgl::TRANSPORT_DATA_BLOCK,
        });
        assert_eq!((s.opcode(), s.cid(), s.nsid(), s.psdt()), (2, 0xBEEF, 1, 1));
        assert_eq!(s.cdw(10), 8);
        assert_eq!(s.sgl().length, 4096);
        assert_eq!(s.0[39], 0x5A);
        let c = Cqe {
            result: 0x1234_5678_9abc,
            sqhd: 3,
            sqid: 1,
            cid: 7,
            status: Status::INVALID_FIELD,
        };
        assert_eq!(Cqe::from_bytes(&c.to_bytes()), c);
    }
}
