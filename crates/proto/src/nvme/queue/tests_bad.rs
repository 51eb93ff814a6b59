//! Bad input: each gets a TermReq with the right FES/FEI and a close, or an
//! NVMe status on a connection that stays up; nothing stays outstanding.

use super::tests::{h2c, in_capsule, resp, rw, sqe, Got, Rig, NQN};
use crate::nvme::cmd::{io, Sqe, Status};
use crate::nvme::pdu::{fes, Digests, Framing, IcReq, Pdu};

fn term(got: &[Got]) -> (u16, u32) {
    match got.last() {
        Some(Got::Term(f, i)) => (*f, *i),
        other => panic!("expected a C2HTermReq, got {other:?}"),
    }
}

#[test]
fn pdu_before_icreq_and_second_icreq() {
    let mut r = Rig::new();
    r.queues.push(super::Queue::new(r.target.limits, false));
    r.closed.push(false);
    r.hosts.push(crate::nvme::decode::Decoder::new(
        crate::nvme::decode::Role::Host,
        1 << 20,
    ));
    r.framing.push(Framing::default());
    let got = r.cmd(0, sqe(io::READ, 1, 1, 512), &[]);
    assert_eq!(term(&got), (fes::PDU_SEQUENCE_ERROR, 0));
    assert!(r.closed[0] && r.queues[0].closing());

    let q = r.open(Digests::default());
    let ic = Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    });
    let mut b = Vec::new();
    ic.encode(&mut b, Framing::default());
    assert_eq!(term(&r.feed(q, &b)), (fes::PDU_SEQUENCE_ERROR, 0));
    // Nothing after the TermReq is read.
    assert!(r.feed(q, &b).is_empty());
}

#[test]
fn bad_headers_close_with_their_field() {
    let cases: [(usize, u8, u32); 4] = [
        (0, 0x42, 0), // unknown type
        (2, 10, 2),   // HLEN
        (4, 3, 4),    // PLEN below HLEN
        (3, 8, 3),    // PDO inside the header (with data)
    ];
    for (at, v, fei) in cases {
        let mut r = Rig::new();
        let (_, q, _) = r.io_queue(Digests::default());
        let mut b = Vec::new();
        Pdu::CapsuleCmd(in_capsule(rw(io::WRITE, 1, 0, 1), 512), &[1; 512])
            .encode(&mut b, Framing::default());
        if at == 4 {
            b[4..8].copy_from_slice(&u32::from(v).to_le_bytes());
        } else {
            b[at] = v;
        }
        let got = r.feed(q, &b);
        assert_eq!(term(&got), (fes::INVALID_HEADER_FIELD, fei), "byte {at}");
        assert!(r.closed[q]);
    }
}

#[test]
fn wrong_header_digest_closes() {
    let mut r = Rig::new();
    let both = Digests {
        header: true,
        data: true,
    };
    let (_, q, _) = r.io_queue(both);
    let mut b = Vec::new();
    Pdu::CapsuleCmd(rw(io::READ, 1, 0, 1), &[]).encode(&mut b, r.framing[q]);
    b[30] ^= 0xFF;
    assert_eq!(term(&r.feed(q, &b)), (fes::HEADER_DIGEST_ERROR, 0));
}

#[test]
fn wrong_data_digest_fails_the_command_only() {
    let mut r = Rig::new();
    let both = Digests {
        header: true,
        data: true,
    };
    let (_, q, _) = r.io_queue(both);
    let mut b = Vec::new();
    Pdu::CapsuleCmd(in_capsule(rw(io::WRITE, 1, 0, 1), 512), &[1; 512])
        .encode(&mut b, r.framing[q]);
    let n = b.len();
    b[n - 1] ^= 1;
    let got = r.feed(q, &b);
    assert_eq!(resp(&got).status, Status::TRANSIENT_TRANSPORT_ERROR);
    assert_eq!(r.disk[..512], [0; 512]);
    assert!(!r.closed[q]);
}

#[test]
fn h2c_data_without_r2t_wrong_ttag_or_too_much() {
    // No R2T outstanding for the CID.
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let got = r.send(q, Pdu::H2CData(h2c(5, 0, 0, true), &[0; 512]));
    assert_eq!(term(&got), (fes::INVALID_HEADER_FIELD, 8));
    // A wrong TTAG.
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let got = r.cmd(q, rw(io::WRITE, 5, 0, 1), &[]);
    let Got::R2T(t) = got[0] else { panic!() };
    let got = r.send(q, Pdu::H2CData(h2c(5, t.ttag ^ 1, 0, true), &[0; 512]));
    assert_eq!(term(&got), (fes::INVALID_HEADER_FIELD, 10));
    // More data than the R2T asked for.
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let got = r.cmd(q, rw(io::WRITE, 5, 0, 1), &[]);
    let Got::R2T(t) = got[0] else { panic!() };
    let got = r.send(q, Pdu::H2CData(h2c(5, t.ttag, 0, true), &[0; 1024]));
    assert_eq!(term(&got), (fes::DATA_OUT_OF_RANGE, 16));
    // Data at an offset other than where the last left off.
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let got = r.cmd(q, rw(io::WRITE, 5, 0, 2), &[]);
    let Got::R2T(t) = got[0] else { panic!() };
    let got = r.send(q, Pdu::H2CData(h2c(5, t.ttag, 512, false), &[0; 512]));
    assert_eq!(term(&got), (fes::DATA_OUT_OF_RANGE, 12));
}

#[test]
fn payload_on_a_no_data_command_and_read_with_in_capsule_data() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    // A Flush carrying 64 bytes: answered, and the bytes are not a PDU.
    let got = r.cmd(q, sqe(io::FLUSH, 1, 1, 0), &[0x04; 64]);
    assert_eq!(resp(&got).status, Status::DATA_SGL_LENGTH_INVALID);
    // A Read that claims in-capsule data runs never, once answered.
    let got = r.cmd(q, in_capsule(rw(io::READ, 2, 0, 8), 4096), &[0; 4096]);
    assert_eq!(resp(&got).status, Status::DATA_SGL_LENGTH_INVALID);
    assert_eq!(got.len(), 1);
    assert_eq!(r.queues[q].outstanding(), 0);
    assert!(!r.closed[q]);
}

#[test]
fn reused_cid_and_queue_overrun() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    r.admit = false;
    assert!(r.cmd(q, rw(io::READ, 9, 0, 1), &[]).is_empty());
    let got = r.cmd(q, rw(io::READ, 9, 0, 1), &[]);
    assert_eq!(resp(&got).status, Status::CID_CONFLICT);
    // The queue holds 32 entries (SQSIZE 31): the 33rd command is fatal.
    for cid in 10..41 {
        assert!(r.cmd(q, rw(io::READ, cid, 0, 1), &[]).is_empty());
    }
    assert_eq!(r.queues[q].outstanding(), 32);
    let got = r.cmd(q, rw(io::READ, 41, 0, 1), &[]);
    assert_eq!(term(&got), (fes::PDU_SEQUENCE_ERROR, 0));
    assert_eq!(r.queues[q].abort_all(), Vec::<u16>::new());
}

#[test]
fn half_a_pdu_waits_for_the_rest() {
    let mut r = Rig::new();
    let (_, q, _) = r.io_queue(Digests::default());
    let mut b = Vec::new();
    Pdu::CapsuleCmd(rw(io::READ, 1, 0, 1), &[]).encode(&mut b, Framing::default());
    let (used, want) = r.queues[q].receive(&b[..30]);
    assert_eq!((used, want), (0, 72));
    let (used, _) = r.queues[q].receive(&b);
    assert_eq!(used, 72);
    let got = r.drive(q);
    assert_eq!(resp(&got).status, Status::SUCCESS);
}

#[test]
fn commands_before_connect_are_out_of_sequence() {
    let mut r = Rig::new();
    let q = r.open(Digests::default());
    let got = r.cmd(q, rw(io::READ, 1, 0, 1), &[]);
    assert_eq!(resp(&got).status, Status::COMMAND_SEQUENCE_ERROR);
    // Connect to an unknown subsystem: invalid parameter at SUBNQN (data).
    let c = r.connect(q, 0, 0xFFFF, "nqn.2026-11.io.iopace:nope");
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(c.result, (1 << 16) | 256);
    // An IO queue for a controller that does not exist.
    let c = r.connect(q, 1, 77, NQN);
    assert_eq!(
        (c.status, c.result),
        (Status::CONNECT_INVALID_PARAMETERS, (1 << 16) | 16)
    );
    // An IO queue before the controller is enabled.
    let a = r.open(Digests::default());
    let cntlid = r.connect(a, 0, 0xFFFF, NQN).result as u16;
    let c = r.connect(q, 1, cntlid, NQN);
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR);
    // The same IO queue id twice.
    r.enable(a);
    assert_eq!(r.connect(q, 1, cntlid, NQN).status, Status::SUCCESS);
    let q2 = r.open(Digests::default());
    let c = r.connect(q2, 1, cntlid, NQN);
    assert_eq!(
        (c.status, c.result),
        (Status::CONNECT_INVALID_PARAMETERS, 42)
    );
    // A second Connect on a bound queue.
    let mut s = Sqe::new(0x7F, 3);
    s.0[4] = 1;
    assert_eq!(
        resp(&r.cmd(q, s, &[])).status,
        Status::COMMAND_SEQUENCE_ERROR
    );
}
