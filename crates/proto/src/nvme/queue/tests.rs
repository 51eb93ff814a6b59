//! Queue and target together, driven as a driver would, against a RAM disk;
//! the host side is built from the codec.

use super::{Action, DevOp, Queue};
use crate::nvme::cmd::{admin, fctype, io, sgl, Cqe, Sgl, Sqe, Status};
use crate::nvme::ctrl::{Connect, Limits, Listener, Namespace, Subsystem, Target};
use crate::nvme::decode::{Decoded, Decoder, Role};
use crate::nvme::pdu::{DataHdr, Digests, Framing, IcReq, Pdu, R2t};

pub(crate) const NQN: &str = "nqn.2026-11.io.iopace:default";
pub(crate) const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-a";

/// What the host got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Got {
    Resp(Cqe),
    Data(u16, Vec<u8>),
    R2T(R2t),
    Term(u16, u32),
    IcResp,
}

pub(crate) struct Rig {
    pub target: Target,
    pub disk: Vec<u8>,
    pub now: u64,
    /// Admit data commands at once (else they wait in `admits`).
    pub admit: bool,
    pub admits: Vec<(usize, u16)>,
    pub queues: Vec<Queue>,
    pub closed: Vec<bool>,
    pub hosts: Vec<Decoder>,
    pub framing: Vec<Framing>,
    pub trims: Vec<(u64, u64)>,
    /// What every host may do (None: the subsystems' host lists decide).
    pub access: Option<crate::Access>,
    /// New queues are external (`Queue::external`); their data actions
    /// are kept here, as (queue, action).
    pub external: bool,
    pub data: Vec<(usize, Action)>,
}

impl Rig {
    pub fn new() -> Rig {
        let mut sub = Subsystem {
            nqn: NQN.into(),
            serial: "iopace0001".into(),
            model: "iopace".into(),
            namespaces: vec![Namespace::new(1, 4 << 20, 9, NQN)],
            hosts: None,
        };
        sub.namespaces[0].read_only = false;
        let l = Listener {
            traddr: "127.0.0.1".into(),
            trsvcid: "4420".into(),
            ipv6: false,
        };
        Rig {
            target: Target::new(vec![sub], vec![l], Limits::default()),
            disk: vec![0; 4 << 20],
            now: 0,
            admit: true,
            admits: Vec::new(),
            queues: Vec::new(),
            closed: Vec::new(),
            hosts: Vec::new(),
            framing: Vec::new(),
            trims: Vec::new(),
            access: None,
            external: false,
            data: Vec::new(),
        }
    }

    /// A new connection with ICReq done; returns its index.
    pub fn open(&mut self, digests: Digests) -> usize {
        self.queues.push(match self.external {
            true => Queue::external(self.target.limits),
            false => Queue::new(self.target.limits, false),
        });
        self.closed.push(false);
        self.hosts.push(Decoder::new(Role::Host, 1 << 21));
        self.framing.push(Framing { digests, pda: 0 });
        let q = self.queues.len() - 1;
        let ic = Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        });
        let mut b = Vec::new();
        ic.encode(&mut b, Framing::default());
        assert_eq!(self.feed(q, &b), vec![Got::IcResp]);
        q
    }

    /// Feeds raw bytes to queue `q`, runs the driver, returns what came back.
    pub fn feed(&mut self, q: usize, bytes: &[u8]) -> Vec<Got> {
        let (used, _) = self.queues[q].receive(bytes);
        assert!(used <= bytes.len());
        self.drive(q)
    }

    /// Sends a PDU framed as negotiated.
    pub fn send(&mut self, q: usize, pdu: Pdu<'_>) -> Vec<Got> {
        let mut b = Vec::new();
        pdu.encode(&mut b, self.framing[q]);
        self.feed(q, &b)
    }

    pub fn cmd(&mut self, q: usize, sqe: Sqe, data: &[u8]) -> Vec<Got> {
        self.send(q, Pdu::CapsuleCmd(sqe, data))
    }

    /// Runs the queue's actions until none is left; decodes its output.
    pub fn drive(&mut self, q: usize) -> Vec<Got> {
        loop {
            let actions = self.queues[q].take_actions();
            if actions.is_empty() {
                break;
            }
            for a in actions {
                self.act(q, a);
            }
        }
        let out = self.queues[q].take_output();
        self.decode(q, &out)
    }

    fn act(&mut self, q: usize, a: Action) {
        match a {
            Action::Connect { cid, sqe, data } => {
                let r = match self.access {
                    Some(a) => self.target.connect_with(&sqe, &data, self.now, &|_, _| a),
                    None => self.target.connect(&sqe, &data, self.now),
                };
                self.queues[q].connected(cid, r);
            }
            Action::Admin { cid, cntlid, sqe } => {
                let d = self.target.admin(cntlid, &sqe, self.now);
                self.queues[q].admin_done(cid, d);
                // As the engine does: Async Event Requests that an Abort
                // or a reset let go complete on this (the admin) queue.
                for (aer, d) in self.target.take_events_of(cntlid) {
                    self.queues[q].aer_end(aer, d);
                }
            }
            Action::Admit { cid, .. } if self.admit => self.queues[q].admit(cid),
            Action::Admit { cid, .. } => self.admits.push((q, cid)),
            Action::Io { cid, op, .. } => {
                let r = self.device(op);
                self.queues[q].io_done(cid, r);
            }
            Action::DropAer { cid, cntlid } => self.target.drop_async_event(cntlid, cid),
            Action::Data { .. } | Action::DataIn { .. } => self.data.push((q, a)),
            Action::Close => self.closed[q] = true,
        }
    }

    fn device(&mut self, op: DevOp) -> Result<Vec<u8>, Status> {
        Ok(match op {
            DevOp::Read { offset, len } => {
                self.disk[offset as usize..(offset + len) as usize].to_vec()
            }
            DevOp::Write { offset, data, .. } => {
                self.disk[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                Vec::new()
            }
            DevOp::Flush => Vec::new(),
            DevOp::WriteZeroes { offset, len } => {
                self.disk[offset as usize..(offset + len) as usize].fill(0);
                Vec::new()
            }
            DevOp::Trim { ranges } => {
                self.trims.extend(ranges);
                Vec::new()
            }
        })
    }

    pub fn decode(&mut self, q: usize, mut b: &[u8]) -> Vec<Got> {
        let mut got = Vec::new();
        while !b.is_empty() {
            let d = &mut self.hosts[q];
            let Ok(Decoded::Pdu {
                pdu,
                len,
                data_digest_ok,
            }) = d.decode(b)
            else {
                panic!("host cannot decode {:?}", d.decode(b));
            };
            assert!(data_digest_ok);
            got.push(match pdu {
                Pdu::IcResp(r) => {
                    d.digests = Some(r.digests);
                    Got::IcResp
                }
                Pdu::CapsuleResp(c) => Got::Resp(c),
                Pdu::C2HData(h, data) => Got::Data(h.cccid, data.to_vec()),
                Pdu::R2T(r) => Got::R2T(r),
                Pdu::C2HTerm(t) => Got::Term(t.fes, t.fei),
                other => panic!("unexpected {other:?}"),
            });
            b = &b[len..];
        }
        got
    }

    /// Connect queue `q` (admin when qid 0); returns the completion.
    pub fn connect(&mut self, q: usize, qid: u16, cntlid: u16, subnqn: &str) -> Cqe {
        self.connect_sized(q, qid, cntlid, subnqn, 31)
    }

    /// As `connect`, with SQSIZE `sqsize` (0's based).
    pub fn connect_sized(
        &mut self,
        q: usize,
        qid: u16,
        cntlid: u16,
        subnqn: &str,
        sqsize: u16,
    ) -> Cqe {
        let c = Connect {
            qid,
            sqsize,
            kato_ms: 0,
            hostid: *b"host-id-0123456\0",
            cntlid,
            subnqn,
            hostnqn: HOST,
        };
        resp(&self.cmd(q, c.sqe(1), &c.data()))
    }

    /// Property Set CC.EN (and the IO queue entry sizes).
    pub fn enable(&mut self, q: usize) {
        let mut s = Sqe::new(admin::FABRICS, 90);
        s.0[4] = fctype::PROPERTY_SET;
        s.set_cdw(11, 0x14);
        s.set_cdw(12, 0x0046_0001);
        assert_eq!(resp(&self.cmd(q, s, &[])).status, Status::SUCCESS);
    }

    /// An admin queue connected and enabled, and an IO queue; (admin, io).
    pub fn io_queue(&mut self, digests: Digests) -> (usize, usize, u16) {
        let a = self.open(Digests::default());
        let cntlid = self.connect(a, 0, 0xFFFF, NQN).result as u16;
        self.enable(a);
        let q = self.open(digests);
        let c = self.connect(q, 1, cntlid, NQN);
        assert_eq!(c.status, Status::SUCCESS);
        (a, q, cntlid)
    }
}

/// The one completion among what came back.
pub(crate) fn resp(got: &[Got]) -> Cqe {
    let r: Vec<Cqe> = got
        .iter()
        .filter_map(|g| match g {
            Got::Resp(c) => Some(*c),
            _ => None,
        })
        .collect();
    assert_eq!(r.len(), 1, "{got:?}");
    r[0]
}

/// A command whose data moves in PDUs (a transport SGL of `len` bytes).
pub(crate) fn sqe(opc: u8, cid: u16, nsid: u32, len: u32) -> Sqe {
    let mut s = Sqe::new(opc, cid);
    s.set_nsid(nsid);
    s.set_sgl(Sgl {
        address: 0,
        length: len,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    s
}

/// A READ or WRITE of `blocks` 512-byte blocks at `lba`.
pub(crate) fn rw(opc: u8, cid: u16, lba: u64, blocks: u32) -> Sqe {
    let mut s = sqe(opc, cid, 1, blocks * 512);
    s.set_cdw(10, lba as u32);
    s.set_cdw(11, (lba >> 32) as u32);
    s.set_cdw(12, blocks - 1);
    s
}

pub(crate) fn in_capsule(mut s: Sqe, len: u32) -> Sqe {
    s.set_sgl(Sgl {
        address: 0,
        length: len,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    s
}

pub(crate) fn h2c(cid: u16, ttag: u16, datao: u32, last: bool) -> DataHdr {
    DataHdr {
        cccid: cid,
        ttag,
        datao,
        last,
        success: false,
    }
}

#[test]
fn write_by_r2t_then_read_back_with_digests() {
    let mut r = Rig::new();
    let both = Digests {
        header: true,
        data: true,
    };
    let (_, q, _) = r.io_queue(both);
    let got = r.cmd(q, rw(io::WRITE, 7, 8, 16), &[]);
    let [Got::R2T(t)] = got[..] else {
        panic!("{got:?}")
    };
    assert_eq!((t.cccid, t.r2to, t.r2tl), (7, 0, 8192));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    assert!(r
        .send(q, Pdu::H2CData(h2c(7, t.ttag, 0, false), &data[..4096]))
        .is_empty());
    let got = r.send(q, Pdu::H2CData(h2c(7, t.ttag, 4096, true), &data[4096..]));
    assert_eq!(resp(&got).status, Status::SUCCESS);
    assert_eq!(&r.disk[4096..4096 + 8192], &data[..]);
    let got = r.cmd(q, rw(io::READ, 8, 8, 16), &[]);
    assert_eq!(got[0], Got::Data(8, data));
    assert_eq!(resp(&got).cid, 8);
    assert_eq!(r.queues[q].outstanding(), 0);
}

#[test]
fn write_waits_for_admission_before_r2t() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    r.admit = false;
    assert!(r.cmd(q, rw(io::WRITE, 1, 0, 8), &[]).is_empty());
    assert_eq!(r.admits, vec![(q, 1)]);
    r.queues[q].admit(1);
    let got = r.drive(q);
    assert!(matches!(
        got[..],
        [Got::R2T(R2t {
            cccid: 1,
            r2tl: 4096,
            ..
        })]
    ));
}

#[test]
fn in_capsule_write_flush_zeroes_trim() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let got = r.cmd(q, in_capsule(rw(io::WRITE, 1, 1, 1), 512), &[0xAB; 512]);
    assert_eq!(resp(&got).status, Status::SUCCESS);
    assert_eq!(r.disk[512..1024], [0xAB; 512]);
    let got = r.cmd(q, sqe(io::FLUSH, 2, 1, 0), &[]);
    assert_eq!(resp(&got).status, Status::SUCCESS);
    let mut wz = sqe(io::WRITE_ZEROES, 3, 1, 0);
    wz.set_cdw(10, 1);
    let got = r.cmd(q, wz, &[]);
    assert_eq!(resp(&got).status, Status::SUCCESS);
    assert_eq!(r.disk[512..1024], [0; 512]);
    let mut dsm = in_capsule(sqe(io::DSM, 4, 1, 32), 32);
    dsm.set_cdw(10, 1); // two ranges
    dsm.set_cdw(11, 1 << 2); // deallocate
    let mut ranges = vec![0u8; 32];
    ranges[4..8].copy_from_slice(&8u32.to_le_bytes());
    ranges[8..16].copy_from_slice(&16u64.to_le_bytes());
    let got = r.cmd(q, dsm, &ranges);
    assert_eq!(resp(&got).status, Status::SUCCESS);
    assert_eq!(r.trims, vec![(16 * 512, 8 * 512)]);
}

#[test]
fn io_errors_are_statuses() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let s = |got: Vec<Got>| resp(&got).status;
    assert_eq!(
        s(r.cmd(q, rw(io::READ, 1, 8191, 2), &[])),
        Status::LBA_OUT_OF_RANGE
    );
    let mut bad_ns = rw(io::READ, 2, 0, 1);
    bad_ns.set_nsid(2);
    assert_eq!(s(r.cmd(q, bad_ns, &[])), Status::INVALID_NAMESPACE);
    assert_eq!(s(r.cmd(q, sqe(0x7E, 3, 1, 0), &[])), Status::INVALID_OPCODE);
    // Over MDTS (1 MiB): 4096 blocks of 512 are 2 MiB.
    assert_eq!(
        s(r.cmd(q, rw(io::READ, 4, 0, 4096), &[])),
        Status::INVALID_FIELD
    );
    // The SGL must say how much moves.
    let mut short = rw(io::READ, 5, 0, 8);
    short.set_sgl(Sgl {
        address: 0,
        length: 512,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    assert_eq!(s(r.cmd(q, short, &[])), Status::DATA_SGL_LENGTH_INVALID);
    assert_eq!(r.queues[q].outstanding(), 0);
    assert!(!r.closed[q]);
}
