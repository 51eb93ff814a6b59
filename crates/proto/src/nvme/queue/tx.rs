//! A queue's send side: the bytes it has for the host, framed as the
//! ICReq negotiated (digests, padding), its SQ head pointer for the
//! completions, and the transfer tags of its R2Ts.

use crate::nvme::cmd::{Cqe, Status};
use crate::nvme::pdu::{DataHdr, Framing, Pdu, R2t};

#[derive(Debug, Default)]
pub(super) struct Tx {
    /// How this end frames what it sends (digests, the host's HPDA).
    framing: Framing,
    out: Vec<u8>,
    sqhd: u16,
    next_ttag: u16,
}

impl Tx {
    /// Frames what follows as the ICReq negotiated.
    pub fn set_framing(&mut self, framing: Framing) {
        self.framing = framing;
    }

    /// Whether data PDUs carry a data digest.
    pub fn data_digest(&self) -> bool {
        self.framing.digests.data
    }

    /// Bytes to send, in order; the caller takes them all.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Appends a PDU framed as before any negotiation (ICResp, TermReq).
    pub fn plain(&mut self, pdu: Pdu<'_>) {
        pdu.encode(&mut self.out, Framing::default());
    }

    /// A capsule came in: the SQ head moves on, round a queue of `depth`.
    pub fn consumed(&mut self, depth: usize) {
        self.sqhd = (self.sqhd + 1) % depth.max(1) as u16;
    }

    /// Appends a completion for `cid` on queue `qid`.
    pub fn respond(&mut self, cid: u16, status: Status, result: u64, qid: u16) {
        let mut out = std::mem::take(&mut self.out);
        self.respond_into(cid, status, result, qid, &mut out);
        self.out = out;
    }

    /// Appends a completion for `cid` on queue `qid` to `out`.
    pub fn respond_into(&self, cid: u16, status: Status, result: u64, qid: u16, out: &mut Vec<u8>) {
        let cqe = Cqe {
            result,
            sqhd: self.sqhd,
            sqid: qid,
            cid,
            status,
        };
        Pdu::CapsuleResp(cqe).encode(out, self.framing);
    }

    /// Appends a C2HData PDU with `data` for `cid`.
    pub fn send_data(&mut self, cid: u16, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let hdr = DataHdr {
            cccid: cid,
            ttag: 0,
            datao: 0,
            last: true,
            success: false,
        };
        Pdu::C2HData(hdr, data).encode(&mut self.out, self.framing);
    }

    /// Appends an R2T for `len` bytes of `cid`'s data: its transfer tag.
    pub fn send_r2t(&mut self, cid: u16, len: u32) -> u16 {
        let ttag = self.next_ttag;
        self.next_ttag = self.next_ttag.wrapping_add(1);
        let r = R2t {
            cccid: cid,
            ttag,
            r2to: 0,
            r2tl: len,
        };
        Pdu::R2T(r).encode(&mut self.out, self.framing);
        ttag
    }

    /// Appends the head of the C2HData PDU that carries `len` bytes of
    /// `cid`'s data (`success`: it completes the command).
    pub fn c2h_head(&self, cid: u16, len: u32, success: bool, out: &mut Vec<u8>) {
        let hdr = DataHdr {
            cccid: cid,
            ttag: 0,
            datao: 0,
            last: true,
            success,
        };
        crate::nvme::pdu::encode_c2h_data_head(out, self.framing, hdr, len as usize);
    }
}
