//! NVMe/TCP PDUs (NVMe/TCP transport specification, section 3.6): their
//! types, fields and encoders. Decoding is in `decode.rs`.
//!
//! Every PDU starts with an 8-byte common header: type, flags, HLEN (the
//! PDU-specific header's end), PDO (where data starts, 0 without data) and
//! PLEN (the whole PDU, little endian). A header digest (CRC32C of the
//! header) follows the header when negotiated, padding up to PDO, the data,
//! and a data digest (CRC32C of the data) when negotiated and data is there.

use super::cmd::{Cqe, Sqe};

/// Bytes of the common header.
pub const CH_LEN: usize = 8;
/// Bytes of a digest (CRC32C, little endian).
pub const DIGEST_LEN: usize = 4;
/// HLEN of ICReq and ICResp (their PLEN too).
pub const IC_LEN: usize = 128;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_HLEN: usize = 24;
/// The most bytes of an offending header a TermReq carries.
pub const TERM_MAX_DATA: usize = 152;
/// HLEN of CapsuleCmd: common header and a 64-byte submission entry.
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + 64;
/// HLEN of CapsuleResp: common header and a 16-byte completion entry.
pub const CAPSULE_RESP_HLEN: usize = CH_LEN + 16;
/// HLEN of H2CData, C2HData and R2T.
pub const DATA_HLEN: usize = 24;

/// PDU type codes.
pub mod ty {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM: u8 = 0x02;
    pub const C2H_TERM: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common-header flags.
pub mod flag {
    /// A header digest follows the header.
    pub const HDGST: u8 = 0x01;
    /// A data digest follows the data.
    pub const DDGST: u8 = 0x02;
    /// H2CData/C2HData: the last data PDU of the command (of this R2T for H2C).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData: the command succeeded; no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal error status (FES) of a TermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Which digests a connection negotiated in ICReq/ICResp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    /// The DGST byte of ICReq/ICResp.
    pub fn to_byte(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }

    pub fn from_byte(b: u8) -> Digests {
        Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        }
    }

    /// Bytes of header digest after each digested header.
    pub fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes of data digest after data, if there is data.
    pub fn data_len(self, data: usize) -> usize {
        if self.data && data > 0 {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// CRC32C as NVMe/TCP digests use it.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// [`crc32c`] of data that goes on after bytes whose CRC was `crc`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// ICReq: the host's connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, 0's based (0..=31).
    pub hpda: u8,
    pub digests: Digests,
    /// Most outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// ICResp: the controller's connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, 0's based.
    pub cpda: u8,
    pub digests: Digests,
    /// Most data bytes in one H2CData PDU (at least 4096, a multiple of 4).
    pub maxh2cdata: u32,
}

/// H2CTermReq/C2HTermReq: a fatal error, then the connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq<'a> {
    pub fes: u16,
    /// Field error information: for a bad header field, its byte offset.
    pub fei: u32,
    /// The offending PDU header (at most `TERM_MAX_DATA` bytes).
    pub data: &'a [u8],
}

/// The fields of H2CData and C2HData.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHdr {
    /// The command's CID.
    pub cccid: u16,
    /// Transfer tag from the R2T (H2CData; 0 in C2HData).
    pub ttag: u16,
    /// Offset of this data in the command's data.
    pub datao: u32,
    pub last: bool,
    /// C2HData only: the command succeeded, no CapsuleResp follows.
    pub success: bool,
}

/// R2T: the controller asks for `r2tl` bytes of a command's data at `r2to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

/// One PDU; data borrowed from the receive buffer (or the sender's memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu<'a> {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTerm(TermReq<'a>),
    C2HTerm(TermReq<'a>),
    /// A command capsule and its in-capsule data (possibly empty).
    CapsuleCmd(Sqe, &'a [u8]),
    CapsuleResp(Cqe),
    H2CData(DataHdr, &'a [u8]),
    C2HData(DataHdr, &'a [u8]),
    R2T(R2t),
}

/// What shapes a PDU on the wire: the digests and, for data PDUs, the
/// sender's data alignment (HPDA from the host, CPDA from the controller).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Framing {
    pub digests: Digests,
    /// 0's based dwords: data starts at a multiple of (pda + 1) * 4.
    pub pda: u8,
}

impl Framing {
    /// PDO for a PDU whose header is `hlen` bytes.
    pub fn pdo(self, hlen: usize) -> usize {
        let end = hlen + self.digests.header_len();
        let align = (usize::from(self.pda) + 1) * 4;
        end.div_ceil(align) * align
    }
}

impl Pdu<'_> {
    pub fn type_code(&self) -> u8 {
        match self {
            Pdu::IcReq(_) => ty::IC_REQ,
            Pdu::IcResp(_) => ty::IC_RESP,
            Pdu::H2CTerm(_) => ty::H2C_TERM,
            Pdu::C2HTerm(_) => ty::C2H_TERM,
            Pdu::CapsuleCmd(..) => ty::CAPSULE_CMD,
            Pdu::CapsuleResp(_) => ty::CAPSULE_RESP,
            Pdu::H2CData(..) => ty::H2C_DATA,
            Pdu::C2HData(..) => ty::C2H_DATA,
            Pdu::R2T(_) => ty::R2T,
        }
    }

    /// The PDU's data: in-capsule data, a data PDU's data, a TermReq's header.
    pub fn data(&self) -> &[u8] {
        match self {
            Pdu::H2CTerm(t) | Pdu::C2HTerm(t) => t.data,
            Pdu::CapsuleCmd(_, d) | Pdu::H2CData(_, d) | Pdu::C2HData(_, d) => d,
            _ => &[],
        }
    }

    /// Whether digests apply: never to ICReq/ICResp and TermReqs.
    fn digested(&self) -> bool {
        !matches!(
            self,
            Pdu::IcReq(_) | Pdu::IcResp(_) | Pdu::H2CTerm(_) | Pdu::C2HTerm(_)
        )
    }

    fn hlen(&self) -> usize {
        match self {
            Pdu::IcReq(_) | Pdu::IcResp(_) => IC_LEN,
            Pdu::H2CTerm(_) | Pdu::C2HTerm(_) => TERM_HLEN,
            Pdu::CapsuleCmd(..) => CAPSULE_CMD_HLEN,
            Pdu::CapsuleResp(_) => CAPSULE_RESP_HLEN,
            Pdu::H2CData(..) | Pdu::C2HData(..) | Pdu::R2T(_) => DATA_HLEN,
        }
    }

    /// Appends the whole PDU: header, digests, padding and data.
    pub fn encode(&self, out: &mut Vec<u8>, framing: Framing) {
        let data = self.data();
        self.encode_head(out, framing, data.len());
        out.extend_from_slice(data);
        if self.digested() && framing.digests.data && !data.is_empty() {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
    }

    /// Appends everything before the data (header, header digest, padding)
    /// for a PDU carrying `data_len` bytes, so a sender can gather the data
    /// from elsewhere; the data digest (`crc32c` of the data) comes after it.
    pub fn encode_head(&self, out: &mut Vec<u8>, framing: Framing, data_len: usize) {
        let f = if self.digested() {
            framing
        } else {
            Framing::default()
        };
        let hlen = self.hlen();
        let start = out.len();
        let (pdo, plen) = if data_len == 0 {
            (0, hlen + f.digests.header_len())
        } else if self.digested() {
            let pdo = f.pdo(hlen);
            (pdo, pdo + data_len + f.digests.data_len(data_len))
        } else {
            (hlen, hlen + data_len)
        };
        let mut flags = self.flags();
        if f.digests.header {
            flags |= flag::HDGST;
        }
        if f.digests.data && data_len > 0 {
            flags |= flag::DDGST;
        }
        out.extend_from_slice(&[self.type_code(), flags, hlen as u8, pdo as u8]);
        out.extend_from_slice(&(plen as u32).to_le_bytes());
        self.encode_fields(out);
        out.resize(start + hlen, 0);
        if f.digests.header {
            let d = crc32c(&out[start..start + hlen]);
            out.extend_from_slice(&d.to_le_bytes());
        }
        if data_len > 0 {
            out.resize(start + pdo, 0);
        }
    }

    fn flags(&self) -> u8 {
        match self {
            Pdu::H2CData(h, _) if h.last => flag::LAST_PDU,
            Pdu::C2HData(h, _) => {
                let mut f = 0;
                if h.last {
                    f |= flag::LAST_PDU;
                }
                if h.success {
                    f |= flag::SUCCESS;
                }
                f
            }
            _ => 0,
        }
    }

    /// The PDU-specific header fields after the common header.
    fn encode_fields(&self, out: &mut Vec<u8>) {
        match self {
            Pdu::IcReq(r) => {
                out.extend_from_slice(&r.pfv.to_le_bytes());
                out.extend_from_slice(&[r.hpda, r.digests.to_byte()]);
                out.extend_from_slice(&r.maxr2t.to_le_bytes());
            }
            Pdu::IcResp(r) => {
                out.extend_from_slice(&r.pfv.to_le_bytes());
                out.extend_from_slice(&[r.cpda, r.digests.to_byte()]);
                out.extend_from_slice(&r.maxh2cdata.to_le_bytes());
            }
            Pdu::H2CTerm(t) | Pdu::C2HTerm(t) => {
                out.extend_from_slice(&t.fes.to_le_bytes());
                out.extend_from_slice(&t.fei.to_le_bytes());
            }
            Pdu::CapsuleCmd(sqe, _) => out.extend_from_slice(&sqe.0),
            Pdu::CapsuleResp(cqe) => out.extend_from_slice(&cqe.to_bytes()),
            Pdu::H2CData(h, d) | Pdu::C2HData(h, d) => {
                out.extend_from_slice(&h.cccid.to_le_bytes());
                out.extend_from_slice(&h.ttag.to_le_bytes());
                out.extend_from_slice(&h.datao.to_le_bytes());
                out.extend_from_slice(&(d.len() as u32).to_le_bytes());
            }
            Pdu::R2T(r) => {
                out.extend_from_slice(&r.cccid.to_le_bytes());
                out.extend_from_slice(&r.ttag.to_le_bytes());
                out.extend_from_slice(&r.r2to.to_le_bytes());
                out.extend_from_slice(&r.r2tl.to_le_bytes());
            }
        }
    }
}

/// Appends a C2HData header for `len` bytes of data the sender gathers from
/// elsewhere (then, with data digests, `crc32c` of that data).
pub fn encode_c2h_data_head(out: &mut Vec<u8>, framing: Framing, hdr: DataHdr, len: usize) {
    encode_data_head(out, framing, Pdu::C2HData(hdr, &[]), hdr, len);
}

/// Appends an H2CData header for `len` bytes of data a host sends from
/// elsewhere: the host's side of [`encode_c2h_data_head`].
pub fn encode_h2c_data_head(out: &mut Vec<u8>, framing: Framing, hdr: DataHdr, len: usize) {
    encode_data_head(out, framing, Pdu::H2CData(hdr, &[]), hdr, len);
}

/// A data PDU's head (`pdu`, whose header is `hdr`, with empty data) for
/// `len` bytes of data: the bytes `Pdu::encode_head` writes for that PDU
/// with its DATAL set to `len`, laid out in one go (every READ's reply
/// has one).
fn encode_data_head(out: &mut Vec<u8>, f: Framing, pdu: Pdu<'_>, hdr: DataHdr, len: usize) {
    let hd = f.digests.header_len();
    let (pdo, plen) = if len == 0 {
        (0, DATA_HLEN + hd)
    } else {
        let pdo = f.pdo(DATA_HLEN);
        (pdo, pdo + len + f.digests.data_len(len))
    };
    let mut flags = pdu.flags();
    if f.digests.header {
        flags |= flag::HDGST;
    }
    if f.digests.data && len > 0 {
        flags |= flag::DDGST;
    }
    let mut h = [0u8; DATA_HLEN];
    h[..4].copy_from_slice(&[pdu.type_code(), flags, DATA_HLEN as u8, pdo as u8]);
    h[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    h[8..10].copy_from_slice(&hdr.cccid.to_le_bytes());
    h[10..12].copy_from_slice(&hdr.ttag.to_le_bytes());
    h[12..16].copy_from_slice(&hdr.datao.to_le_bytes());
    h[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    let start = out.len();
    out.extend_from_slice(&h);
    if f.digests.header {
        out.extend_from_slice(&crc32c(&h).to_le_bytes());
    }
    if len > 0 {
        out.resize(start + pdo, 0);
    }
}
