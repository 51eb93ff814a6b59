//! Decoding NVMe/TCP PDUs from a byte stream, sans-IO. The decoder checks
//! every header field a peer controls and turns a bad one into the fatal
//! error (FES, FEI) its TermReq reports; it never panics on input, and it
//! rejects a bad or huge PLEN from the first 8 bytes, before buffering.

use super::cmd::{Cqe, Sqe};
use super::pdu::{
    crc32c, fes, flag, ty, DataHdr, Digests, IcReq, IcResp, Pdu, R2t, TermReq, CAPSULE_CMD_HLEN,
    CAPSULE_RESP_HLEN, CH_LEN, DATA_HLEN, DIGEST_LEN, IC_LEN, TERM_HLEN, TERM_MAX_DATA,
};

/// Which end decodes: a controller receives host-to-controller PDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Controller,
    Host,
}

/// A fatal transport error: send a TermReq with these and close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fatal {
    pub fes: u16,
    pub fei: u32,
}

impl Fatal {
    fn field(fei: u32) -> Fatal {
        Fatal {
            fes: fes::INVALID_HEADER_FIELD,
            fei,
        }
    }
}

/// The result of one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// The next PDU needs this many bytes in all (the buffer has fewer).
    Need(usize),
    /// A PDU of `len` bytes. A data digest mismatch is not fatal: the
    /// command it belongs to fails with a transient transport error.
    Pdu {
        pdu: Pdu<'a>,
        len: usize,
        data_digest_ok: bool,
    },
}

/// A connection's decoder: its role, what was negotiated, its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder {
    pub role: Role,
    /// The digests, once ICReq/ICResp have passed; before that only the
    /// initialize PDUs are in sequence, after it they are not.
    pub digests: Option<Digests>,
    /// Most data bytes in one capsule (in-capsule data) or data PDU.
    pub max_data: u32,
}

/// The common header's fields.
#[derive(Debug, Clone, Copy)]
struct Common {
    ty: u8,
    flags: u8,
    hlen: usize,
    pdo: usize,
    plen: usize,
}

impl Decoder {
    pub fn new(role: Role, max_data: u32) -> Decoder {
        Decoder {
            role,
            digests: None,
            max_data,
        }
    }

    /// Decodes the PDU at the start of `buf`.
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Decoded<'a>, Fatal> {
        let Some(head) = buf.get(..CH_LEN) else {
            return Ok(Decoded::Need(CH_LEN));
        };
        let c = self.check_common(head)?;
        let Some(pdu) = buf.get(..c.plen) else {
            return Ok(Decoded::Need(c.plen));
        };
        let dg = self.digests.unwrap_or_default();
        let hd = if digested(c.ty) { dg.header_len() } else { 0 };
        if hd > 0 {
            let want = le32(pdu, c.hlen);
            if crc32c(&pdu[..c.hlen]) != want {
                return Err(Fatal {
                    fes: fes::HEADER_DIGEST_ERROR,
                    fei: 0,
                });
            }
        }
        let (data, data_digest_ok) = self.data(pdu, &c, hd)?;
        let pdu = parse(pdu, &c, data)?;
        Ok(Decoded::Pdu {
            pdu,
            len: c.plen,
            data_digest_ok,
        })
    }

    /// Checks the common header alone: type in sequence and for this role,
    /// HLEN, flags and PLEN's bounds. Returns the fields.
    fn check_common(&self, h: &[u8]) -> Result<Common, Fatal> {
        let c = Common {
            ty: h[0],
            flags: h[1],
            hlen: usize::from(h[2]),
            pdo: usize::from(h[3]),
            plen: le32(h, 4) as usize,
        };
        let Some(hlen) = self.expected_hlen(c.ty) else {
            return Err(Fatal::field(0));
        };
        let ic = matches!(c.ty, ty::IC_REQ | ty::IC_RESP);
        let term = matches!(c.ty, ty::H2C_TERM | ty::C2H_TERM);
        if ic == self.digests.is_some() && !term {
            return Err(Fatal {
                fes: fes::PDU_SEQUENCE_ERROR,
                fei: 0,
            });
        }
        if c.hlen != hlen {
            return Err(Fatal::field(2));
        }
        let dg = self.digests.unwrap_or_default();
        let hd = if digested(c.ty) { dg.header_len() } else { 0 };
        if c.plen < hlen + hd || c.plen > self.max_plen(c.ty, hd) {
            return Err(Fatal::field(4));
        }
        let has_data = c.plen > hlen + hd;
        let want = if digested(c.ty) {
            let mut f = 0;
            if dg.header {
                f |= flag::HDGST;
            }
            if dg.data && has_data && carries_data(c.ty) {
                f |= flag::DDGST;
            }
            f
        } else {
            0
        };
        if c.flags & (flag::HDGST | flag::DDGST) != want {
            return Err(Fatal::field(1));
        }
        Ok(c)
    }

    /// HLEN of a PDU type this role receives; None for any other type.
    fn expected_hlen(&self, t: u8) -> Option<usize> {
        match (self.role, t) {
            (Role::Controller, ty::IC_REQ) | (Role::Host, ty::IC_RESP) => Some(IC_LEN),
            (Role::Controller, ty::H2C_TERM) | (Role::Host, ty::C2H_TERM) => Some(TERM_HLEN),
            (Role::Controller, ty::CAPSULE_CMD) => Some(CAPSULE_CMD_HLEN),
            (Role::Host, ty::CAPSULE_RESP) => Some(CAPSULE_RESP_HLEN),
            (Role::Controller, ty::H2C_DATA) | (Role::Host, ty::C2H_DATA | ty::R2T) => {
                Some(DATA_HLEN)
            }
            _ => None,
        }
    }

    /// The largest PLEN a PDU of this type may have.
    fn max_plen(&self, t: u8, hd: usize) -> usize {
        let dd = self.digests.unwrap_or_default().data_len(1);
        match t {
            ty::IC_REQ | ty::IC_RESP => IC_LEN,
            ty::H2C_TERM | ty::C2H_TERM => TERM_HLEN + TERM_MAX_DATA,
            // Header, digest, up to 31 dwords of alignment, data, digest.
            ty::CAPSULE_CMD | ty::H2C_DATA | ty::C2H_DATA => {
                let hlen = self.expected_hlen(t).unwrap_or(0);
                hlen + hd + 128 + self.max_data as usize + dd
            }
            _ => self.expected_hlen(t).unwrap_or(0) + hd,
        }
    }

    /// Where the data lies, and whether its digest matches.
    fn data<'a>(&self, pdu: &'a [u8], c: &Common, hd: usize) -> Result<(&'a [u8], bool), Fatal> {
        let min = c.hlen + hd;
        if c.plen == min {
            return Ok((&[], true));
        }
        if !carries_data(c.ty) {
            return Err(Fatal::field(4));
        }
        if matches!(c.ty, ty::H2C_TERM | ty::C2H_TERM) {
            return Ok((&pdu[c.hlen..], true));
        }
        let dd = if c.flags & flag::DDGST != 0 {
            DIGEST_LEN
        } else {
            0
        };
        // PDO must lie past the header (and its digest) and leave data.
        if c.pdo < min || c.pdo + dd >= c.plen {
            return Err(Fatal::field(3));
        }
        let data = &pdu[c.pdo..c.plen - dd];
        if data.len() > self.max_data as usize {
            return Err(Fatal {
                fes: fes::DATA_LIMIT_EXCEEDED,
                fei: 0,
            });
        }
        let ok = dd == 0 || crc32c(data) == le32(pdu, c.plen - dd);
        Ok((data, ok))
    }
}

/// The head of an H2CData PDU whose header, up to its data (PDO), is in
/// the buffer but whose data is not all there: everything but the data
/// and its digest is checked (`Decoder::data_head`), and the caller takes
/// the data as it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHead {
    pub hdr: DataHdr,
    /// Where the data starts (PDO).
    pub start: usize,
    /// Bytes of data.
    pub len: usize,
    /// A data digest follows the data.
    pub digest: bool,
}

impl Decoder {
    /// The head of the H2CData PDU at the start of `buf` when `decode`
    /// needs more bytes for it and its header (up to PDO) is all here,
    /// checked as `decode` checks it and in the same order. Ok(None): not
    /// such a PDU, or its header is not yet all here.
    pub fn data_head(&self, buf: &[u8]) -> Result<Option<DataHead>, Fatal> {
        let Some(head) = buf.get(..CH_LEN) else {
            return Ok(None);
        };
        if self.role != Role::Controller || head[0] != ty::H2C_DATA {
            return Ok(None);
        }
        let c = self.check_common(head)?;
        let hd = self.digests.unwrap_or_default().header_len();
        let min = c.hlen + hd;
        if buf.len() >= c.plen || buf.len() < min || c.plen == min {
            return Ok(None);
        }
        if hd > 0 && crc32c(&buf[..c.hlen]) != le32(buf, c.hlen) {
            return Err(Fatal {
                fes: fes::HEADER_DIGEST_ERROR,
                fei: 0,
            });
        }
        let dd = if c.flags & flag::DDGST != 0 {
            DIGEST_LEN
        } else {
            0
        };
        if c.pdo < min || c.pdo + dd >= c.plen {
            return Err(Fatal::field(3));
        }
        if buf.len() < c.pdo {
            return Ok(None);
        }
        let len = c.plen - c.pdo - dd;
        if len > self.max_data as usize {
            return Err(Fatal {
                fes: fes::DATA_LIMIT_EXCEEDED,
                fei: 0,
            });
        }
        if le32(buf, 16) as usize != len {
            return Err(Fatal::field(16));
        }
        if c.flags & flag::SUCCESS != 0 {
            return Err(Fatal::field(1));
        }
        let hdr = DataHdr {
            cccid: le16(buf, 8),
            ttag: le16(buf, 10),
            datao: le32(buf, 12),
            last: c.flags & flag::LAST_PDU != 0,
            success: false,
        };
        Ok(Some(DataHead {
            hdr,
            start: c.pdo,
            len,
            digest: dd > 0,
        }))
    }
}

fn digested(t: u8) -> bool {
    !matches!(t, ty::IC_REQ | ty::IC_RESP | ty::H2C_TERM | ty::C2H_TERM)
}

fn carries_data(t: u8) -> bool {
    matches!(
        t,
        ty::CAPSULE_CMD | ty::H2C_DATA | ty::C2H_DATA | ty::H2C_TERM | ty::C2H_TERM
    )
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The PDU-specific fields; `p` holds the whole PDU (PLEN bytes).
fn parse<'a>(p: &'a [u8], c: &Common, data: &'a [u8]) -> Result<Pdu<'a>, Fatal> {
    Ok(match c.ty {
        ty::IC_REQ | ty::IC_RESP => parse_ic(p, c.ty)?,
        ty::H2C_TERM | ty::C2H_TERM => {
            let t = TermReq {
                fes: le16(p, 8),
                fei: le32(p, 10),
                data,
            };
            if c.ty == ty::H2C_TERM {
                Pdu::H2CTerm(t)
            } else {
                Pdu::C2HTerm(t)
            }
        }
        ty::CAPSULE_CMD => {
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&p[CH_LEN..CH_LEN + 64]);
            Pdu::CapsuleCmd(Sqe(sqe), data)
        }
        ty::CAPSULE_RESP => Pdu::CapsuleResp(Cqe::from_bytes(&p[CH_LEN..CH_LEN + 16])),
        ty::R2T => Pdu::R2T(R2t {
            cccid: le16(p, 8),
            ttag: le16(p, 10),
            r2to: le32(p, 12),
            r2tl: le32(p, 16),
        }),
        _ => parse_data(p, c, data)?,
    })
}

fn parse_ic(p: &[u8], t: u8) -> Result<Pdu<'static>, Fatal> {
    let pfv = le16(p, 8);
    if pfv != 0 {
        return Err(Fatal::field(8));
    }
    let pda = p[10];
    if pda > 31 {
        return Err(Fatal::field(10));
    }
    let digests = Digests::from_byte(p[11]);
    let v = le32(p, 12);
    if t == ty::IC_REQ {
        return Ok(Pdu::IcReq(IcReq {
            pfv,
            hpda: pda,
            digests,
            maxr2t: v,
        }));
    }
    if v < 4096 || !v.is_multiple_of(4) {
        return Err(Fatal::field(12));
    }
    Ok(Pdu::IcResp(IcResp {
        pfv,
        cpda: pda,
        digests,
        maxh2cdata: v,
    }))
}

/// H2CData or C2HData: DATAL must say how much data there is.
fn parse_data<'a>(p: &'a [u8], c: &Common, data: &'a [u8]) -> Result<Pdu<'a>, Fatal> {
    let datal = le32(p, 16) as usize;
    if data.is_empty() || datal != data.len() {
        return Err(Fatal::field(16));
    }
    let success = c.flags & flag::SUCCESS != 0;
    let last = c.flags & flag::LAST_PDU != 0;
    let h2c = c.ty == ty::H2C_DATA;
    if success && (h2c || !last) {
        return Err(Fatal::field(1));
    }
    let hdr = DataHdr {
        cccid: le16(p, 8),
        ttag: if h2c { le16(p, 10) } else { 0 },
        datao: le32(p, 12),
        last,
        success,
    };
    Ok(if h2c {
        Pdu::H2CData(hdr, data)
    } else {
        Pdu::C2HData(hdr, data)
    })
}
