//! The NVMe/TCP client side of a simulated host, built from the protocol
//! crate's codec (`proto::nvme`): the PDUs it sends (ICReq, Connect,
//! Property Get/Set, Identify, READ and WRITE capsules, H2CData heads), the
//! setup replies it decodes, and each I/O queue's host-side state: its
//! command ids and the PDUs of the target's send stream, read header by
//! header (their data is counted, not copied).

use std::collections::VecDeque;

use proto::nvme::cmd::{admin, fctype, io, sgl, Cqe, Sgl, Sqe, Status};
use proto::nvme::ctrl::Connect;
use proto::nvme::decode::{Decoded, Decoder, Role};
use proto::nvme::pdu::{
    encode_h2c_data_head, flag, ty, DataHdr, Digests, Framing, IcReq, Pdu, CH_LEN, DATA_HLEN,
};

use crate::chunk::{Chunk, NvmeMark};

/// The admin queue's size (0's based SQSIZE + 1), as Linux hosts ask.
pub const ADMIN_QUEUE: u16 = 32;
const ICREQ: IcReq = IcReq {
    pfv: 0,
    hpda: 0,
    digests: Digests {
        header: false,
        data: false,
    },
    maxr2t: 0,
};

/// Host `h`'s NQN: every queue of one host names it, so the target's pacer
/// sees one host with a flow per queue.
pub fn host_nqn(h: usize) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:iopace-sim-host-{h}")
}

fn host_id(h: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&(h as u64).to_le_bytes());
    id[8] = 0x51; // not all zero
    id
}

fn pdu(p: Pdu<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    p.encode(&mut b, Framing::default());
    b
}

/// ICReq, then a Connect for queue `qid` of `subnqn` as host `h` (admin:
/// `cntlid` 0xFFFF), `entries` deep, no keep-alive.
pub fn open_queue(h: usize, subnqn: &str, qid: u16, cntlid: u16, entries: u16) -> Vec<u8> {
    let hostnqn = host_nqn(h);
    let c = Connect {
        qid,
        sqsize: entries - 1,
        kato_ms: 0,
        hostid: host_id(h),
        cntlid,
        subnqn,
        hostnqn: &hostnqn,
    };
    let mut b = pdu(Pdu::IcReq(ICREQ));
    b.extend(pdu(Pdu::CapsuleCmd(c.sqe(1), &c.data())));
    b
}

/// Property Get of CAP (8 bytes at 0h).
pub fn get_cap(cid: u16) -> Vec<u8> {
    let mut p = Sqe::new(admin::FABRICS, cid);
    p.0[4] = fctype::PROPERTY_GET;
    p.set_cdw(10, 1); // 8 bytes
    p.set_cdw(11, 0);
    pdu(Pdu::CapsuleCmd(p, &[]))
}

/// Property Set of CC (14h): enabled, 64-byte SQEs, 16-byte CQEs.
pub fn enable(cid: u16) -> Vec<u8> {
    let mut p = Sqe::new(admin::FABRICS, cid);
    p.0[4] = fctype::PROPERTY_SET;
    p.set_cdw(11, 0x14);
    p.set_cdw(12, 0x0046_0001);
    pdu(Pdu::CapsuleCmd(p, &[]))
}

/// Identify: CNS 1 (the controller) or 0 (namespace 1).
pub fn identify(cid: u16, cns: u32) -> Vec<u8> {
    let mut s = Sqe::new(admin::IDENTIFY, cid);
    s.set_nsid(if cns == 0 { 1 } else { 0 });
    s.set_cdw(10, cns);
    s.set_sgl(Sgl {
        address: 0,
        length: 4096,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    pdu(Pdu::CapsuleCmd(s, &[]))
}

/// A READ or WRITE capsule's PDU head for `bytes` at byte `offset` of
/// namespace 1 (blocks of `1 << shift` bytes). With `in_capsule` the
/// WRITE's data follows in the capsule; otherwise it waits for an R2T.
pub fn capsule(
    read: bool,
    cid: u16,
    offset: u64,
    bytes: u32,
    shift: u8,
    in_capsule: bool,
) -> Vec<u8> {
    let mut c = Sqe::new(if read { io::READ } else { io::WRITE }, cid);
    c.set_nsid(1);
    let lba = offset >> shift;
    c.set_cdw(10, lba as u32);
    c.set_cdw(11, (lba >> 32) as u32);
    c.set_cdw(12, (bytes >> shift) - 1);
    let id = match in_capsule {
        true => sgl::DATA_BLOCK_OFFSET,
        false => sgl::TRANSPORT_DATA_BLOCK,
    };
    c.set_sgl(Sgl {
        address: 0,
        length: bytes,
        id,
    });
    let p = Pdu::CapsuleCmd(c, &[]);
    let mut b = Vec::new();
    p.encode_head(
        &mut b,
        Framing::default(),
        if in_capsule { bytes as usize } else { 0 },
    );
    b
}

/// An H2CData PDU's head for `len` bytes at `datao` of command `cid`'s data.
pub fn h2c_head(cid: u16, ttag: u16, datao: u32, len: u32, last: bool) -> Vec<u8> {
    let hdr = DataHdr {
        cccid: cid,
        ttag,
        datao,
        last,
        success: false,
    };
    let mut b = Vec::new();
    encode_h2c_data_head(&mut b, Framing::default(), hdr, len as usize);
    b
}

/// A setup reply, decoded by the protocol crate's decoder.
#[derive(Debug)]
pub enum SetupReply {
    IcResp { maxh2cdata: u32 },
    Resp(Cqe),
    Data(Vec<u8>),
}

/// Decodes the whole PDUs of `bytes` (the first a fresh queue's ICResp
/// when `fresh`). Err: what was wrong.
pub fn setup_replies(bytes: &[u8], fresh: bool) -> Result<Vec<SetupReply>, String> {
    let mut d = Decoder::new(Role::Host, 1 << 20);
    if !fresh {
        d.digests = Some(Digests::default());
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match d.decode(&bytes[at..]) {
            Ok(Decoded::Pdu { pdu, len, .. }) => {
                at += len;
                out.push(match pdu {
                    Pdu::IcResp(r) => {
                        d.digests = Some(Digests::default());
                        SetupReply::IcResp {
                            maxh2cdata: r.maxh2cdata,
                        }
                    }
                    Pdu::CapsuleResp(c) => SetupReply::Resp(c),
                    Pdu::C2HData(_, data) => SetupReply::Data(data.to_vec()),
                    p => return Err(format!("unexpected PDU type {}", p.type_code())),
                });
            }
            Ok(Decoded::Need(n)) => return Err(format!("a partial PDU ({n} bytes wanted)")),
            Err(f) => return Err(format!("a bad PDU: {f:?}")),
        }
    }
    Ok(out)
}

/// The one completion among `replies`, with any data before it; Err when
/// it is missing or failed.
pub fn completion(replies: &[SetupReply]) -> Result<(Cqe, Option<&[u8]>), String> {
    let mut data = None;
    for r in replies {
        match r {
            SetupReply::Data(d) => data = Some(&d[..]),
            SetupReply::Resp(c) if c.status == Status::SUCCESS => return Ok((*c, data)),
            SetupReply::Resp(c) => return Err(format!("status {:?}", c.status)),
            SetupReply::IcResp { .. } => {}
        }
    }
    Err("no completion".into())
}

/// One I/O queue, the host's side: which IO each command id carries, the
/// IOs waiting for a free one, and the PDUs the target sends.
#[derive(Debug)]
pub struct HostQueue {
    /// The IO of each command id (`FREE`: none).
    ios: Vec<u32>,
    free: Vec<u16>,
    /// IOs waiting for a command id (the queue is full), oldest first.
    pub backlog: VecDeque<u32>,
    /// Most data bytes in one H2CData PDU (ICResp).
    pub maxh2cdata: u32,
    /// Most WRITE data carried in a capsule (IOCCSZ).
    pub in_capsule: u32,
    /// The namespace's block size, log2.
    pub shift: u8,
    parser: PduParser,
}

const FREE: u32 = u32::MAX;

impl HostQueue {
    pub fn new(entries: u16, maxh2cdata: u32, in_capsule: u32, shift: u8) -> HostQueue {
        HostQueue {
            ios: vec![FREE; usize::from(entries)],
            free: (0..entries).rev().collect(),
            backlog: VecDeque::new(),
            maxh2cdata,
            in_capsule,
            shift,
            parser: PduParser::default(),
        }
    }

    /// A command id for IO `io`, if one is free.
    pub fn take_cid(&mut self, io: u32) -> Option<u16> {
        let cid = self.free.pop()?;
        debug_assert_eq!(self.ios[usize::from(cid)], FREE);
        self.ios[usize::from(cid)] = io;
        Some(cid)
    }

    /// The IO command `cid` carries.
    pub fn io_of(&self, cid: u16) -> Option<u32> {
        self.ios
            .get(usize::from(cid))
            .copied()
            .filter(|&i| i != FREE)
    }

    /// Command `cid` completed at the host: its id is free again.
    pub fn release(&mut self, cid: u16) {
        let slot = &mut self.ios[usize::from(cid)];
        debug_assert_ne!(*slot, FREE, "cid {cid} released twice");
        *slot = FREE;
        self.free.push(cid);
    }

    /// Commands in flight.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.ios.len() - self.free.len()
    }

    /// Reads `bytes` of the target's stream up to the end of the first
    /// PDU that ends in them (see [`PduParser::parse_one`]).
    pub fn parse_one(&mut self, bytes: &[u8], out: &mut Vec<Chunk>) -> Result<(), String> {
        self.parser.parse_one(bytes, out)
    }

    /// The bytes of the PDU being read not yet in a chunk, as one.
    pub fn flush_part(&mut self, out: &mut Vec<Chunk>) {
        self.parser.flush_part(out)
    }

    /// Whether a send may end here: not inside a PDU's header.
    pub fn between_headers(&self) -> bool {
        self.parser.have == 0
    }
}

/// The PDU being read from the target's send stream.
#[derive(Debug, Default)]
struct PduParser {
    header: [u8; DATA_HLEN],
    have: usize,
    /// Bytes of the current PDU read and not yet in a chunk.
    pending: u32,
    /// The PDU whose header is read: its command id, bytes still to come
    /// and what its end means.
    body: Option<(u16, u64, Option<NvmeMark>)>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl PduParser {
    /// Reads `bytes` until a PDU ends in them: its chunk (its bytes since
    /// the last chunk) goes to `out`, its end marked with what it means to
    /// the host, and the rest of `bytes` is left. Err: a PDU a host does
    /// not expect on an I/O queue.
    fn parse_one(&mut self, mut bytes: &[u8], out: &mut Vec<Chunk>) -> Result<(), String> {
        while !bytes.is_empty() {
            if let Some((_, left, _)) = &mut self.body {
                let k = (bytes.len() as u64).min(*left);
                *left -= k;
                self.pending += k as u32;
                bytes = &bytes[k as usize..];
            } else {
                let want = if self.have < CH_LEN {
                    CH_LEN
                } else {
                    usize::from(self.header[2])
                };
                if !(CH_LEN..=DATA_HLEN).contains(&want) || want == CH_LEN && self.have == CH_LEN {
                    return Err(format!("HLEN {want}: not an I/O queue's PDU"));
                }
                let k = (want - self.have).min(bytes.len());
                self.header[self.have..self.have + k].copy_from_slice(&bytes[..k]);
                self.have += k;
                bytes = &bytes[k..];
                if self.have < want || want == CH_LEN {
                    continue; // the common header read: HLEN is known
                }
                self.have = 0;
                self.pending += want as u32;
                self.body = Some(self.head(want)?);
            }
            if let Some((cid, 0, mark)) = self.body {
                self.body = None;
                out.push(Chunk {
                    cookie: u64::from(cid),
                    bytes: self.pending,
                    last: matches!(mark, Some(NvmeMark::Done { .. })),
                    nvme: mark,
                });
                self.pending = 0;
                return Ok(());
            }
        }
        Ok(())
    }

    /// A whole header of `hlen` bytes: (command id, bytes after it, mark).
    fn head(&self, hlen: usize) -> Result<(u16, u64, Option<NvmeMark>), String> {
        let h = &self.header[..hlen];
        let plen = le32(h, 4);
        let after = u64::from(plen)
            .checked_sub(hlen as u64)
            .ok_or_else(|| format!("PLEN {plen} below HLEN {hlen}"))?;
        match (h[0], hlen) {
            (ty::CAPSULE_RESP, 24) => {
                let c = Cqe::from_bytes(&h[CH_LEN..]);
                let status = c.status.to_field();
                Ok((c.cid, after, Some(NvmeMark::Done { status, data: 0 })))
            }
            (ty::C2H_DATA, DATA_HLEN) => {
                let (cid, datao, datal) = (le16(h, 8), le32(h, 12), le32(h, 16));
                let done = flag::LAST_PDU | flag::SUCCESS;
                let mark = (h[1] & done == done).then_some(NvmeMark::Done {
                    status: 0,
                    data: datao + datal,
                });
                if u64::from(datal) != after {
                    return Err(format!("C2HData: DATAL {datal}, {after} bytes follow"));
                }
                Ok((cid, after, mark))
            }
            (ty::R2T, DATA_HLEN) => {
                let mark = NvmeMark::R2t {
                    ttag: le16(h, 10),
                    offset: le32(h, 12),
                    len: le32(h, 16),
                };
                Ok((le16(h, 8), after, Some(mark)))
            }
            (t, _) => Err(format!("PDU type {t} (HLEN {hlen}) on an I/O queue")),
        }
    }

    fn flush_part(&mut self, out: &mut Vec<Chunk>) {
        if let Some((cid, _, _)) = self.body {
            if self.pending > 0 {
                out.push(Chunk {
                    cookie: u64::from(cid),
                    bytes: self.pending,
                    last: false,
                    nvme: None,
                });
                self.pending = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::nvme::pdu::R2t;

    fn bytes(p: Pdu<'_>) -> Vec<u8> {
        pdu(p)
    }

    #[test]
    fn the_targets_pdus_cut_into_chunks_one_pdu_at_a_time() {
        let mut q = HostQueue::new(4, 1 << 17, 8192, 9);
        let hdr = DataHdr {
            cccid: 2,
            ttag: 0,
            datao: 0,
            last: true,
            success: true,
        };
        let data = bytes(Pdu::C2HData(hdr, &[7; 1000]));
        let r2t = bytes(Pdu::R2T(R2t {
            cccid: 3,
            ttag: 9,
            r2to: 0,
            r2tl: 4096,
        }));
        let cqe = Cqe {
            cid: 1,
            ..Cqe::default()
        };
        let resp = bytes(Pdu::CapsuleResp(cqe));
        let mut out = Vec::new();
        // A C2HData cut by a short send: its first part, then the rest.
        q.parse_one(&data[..100], &mut out).expect("parses");
        q.flush_part(&mut out);
        q.parse_one(&data[100..], &mut out).expect("parses");
        let done = NvmeMark::Done {
            status: 0,
            data: 1000,
        };
        let want = [(2, 100, false, None), (2, 924, true, Some(done))];
        let got: Vec<_> = out
            .iter()
            .map(|c| (c.cookie, c.bytes, c.last, c.nvme))
            .collect();
        assert_eq!(got, want);
        // Two PDUs in one send: only the first is taken.
        out.clear();
        let both = [r2t.clone(), resp.clone()].concat();
        q.parse_one(&both, &mut out).expect("parses");
        let ask = NvmeMark::R2t {
            ttag: 9,
            offset: 0,
            len: 4096,
        };
        assert_eq!(
            out,
            [Chunk {
                cookie: 3,
                bytes: 24,
                last: false,
                nvme: Some(ask)
            }]
        );
        q.parse_one(&resp, &mut out).expect("parses");
        assert_eq!(out[1].nvme, Some(NvmeMark::Done { status: 0, data: 0 }));
        assert!(q.between_headers());
        // An ICResp is not an I/O queue's.
        let mut q = HostQueue::new(4, 1 << 17, 8192, 9);
        let ic = bytes(Pdu::IcReq(ICREQ));
        assert!(q.parse_one(&ic, &mut out).is_err());
    }

    #[test]
    fn command_ids_come_back_and_the_queue_says_when_it_is_full() {
        let mut q = HostQueue::new(2, 1 << 17, 8192, 9);
        let (a, b) = (q.take_cid(10), q.take_cid(11));
        assert_eq!((q.take_cid(12), q.in_flight()), (None, 2));
        let (a, b) = (a.expect("a cid"), b.expect("a cid"));
        assert_eq!((q.io_of(a), q.io_of(b)), (Some(10), Some(11)));
        q.release(a);
        assert_eq!(q.io_of(a), None);
        assert_eq!(q.take_cid(12), Some(a));
    }
}
