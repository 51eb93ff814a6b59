//! An external queue (`Queue::external`): the driver admits READs and
//! WRITEs, holds their data and encodes their completions.

use super::tests::{h2c, resp, rw, Got, Rig};
use super::{Action, DataStart};
use crate::nvme::cmd::{io, Status};
use crate::nvme::pdu::{Digests, Framing, Pdu};

fn rig(digests: Digests) -> (Rig, usize) {
    let mut r = Rig::new();
    r.external = true;
    r.admit = false;
    let (_, q, _) = r.io_queue(digests);
    (r, q)
}

#[test]
fn a_write_asks_admission_then_its_data_comes_as_ranges() {
    let digests = Digests {
        header: true,
        data: true,
    };
    let (mut r, q) = rig(digests);
    assert!(
        r.cmd(q, rw(io::WRITE, 4, 0, 16), &[]).is_empty(),
        "no R2T yet"
    );
    assert_eq!(r.admits, [(q, 4)]);
    assert_eq!(r.queues[q].request_data(4), DataStart::Requested);
    let got = r.drive(q);
    let Got::R2T(t) = &got[0] else {
        panic!("{got:?}")
    };
    assert_eq!((t.cccid, t.r2tl), (4, 8192));
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    let mut b = Vec::new();
    let framing = Framing { digests, pda: 0 };
    Pdu::H2CData(h2c(4, t.ttag, 0, true), &data).encode(&mut b, framing);
    let (used, _) = r.queues[q].receive(&b);
    assert_eq!(used, b.len());
    let actions = r.queues[q].take_actions();
    let [Action::Data {
        cid: 4,
        datao: 0,
        at,
        len: 8192,
    }, Action::DataIn { cid: 4, ok: true }] = actions[..]
    else {
        panic!("{actions:?}")
    };
    assert_eq!(&b[at..at + 8192], &data[..], "the range is the data");
    let mut out = Vec::new();
    assert!(r.queues[q].finish_external(4, Status::SUCCESS, &mut out));
    assert_eq!(resp(&r.decode(q, &out)).status, Status::SUCCESS);
    assert!(!r.queues[q].has(4));
}

#[test]
fn a_bad_data_digest_and_in_capsule_data() {
    let digests = Digests {
        header: false,
        data: true,
    };
    let (mut r, q) = rig(digests);
    r.cmd(q, rw(io::WRITE, 5, 0, 1), &[]);
    assert_eq!(r.queues[q].request_data(5), DataStart::Requested);
    let Got::R2T(t) = r.drive(q)[0].clone() else {
        panic!("no R2T")
    };
    let mut b = Vec::new();
    Pdu::H2CData(h2c(5, t.ttag, 0, true), &[7; 512]).encode(&mut b, Framing { digests, pda: 0 });
    let last = b.len() - 1;
    b[last] ^= 1; // the data digest
    r.queues[q].receive(&b);
    let actions = r.queues[q].take_actions();
    assert!(
        matches!(actions.last(), Some(Action::DataIn { cid: 5, ok: false })),
        "{actions:?}"
    );
    // In-capsule data is handed over whole once admitted.
    let c = super::tests::in_capsule(rw(io::WRITE, 6, 8, 1), 512);
    r.cmd(q, c, &[9; 512]);
    assert_eq!(
        r.queues[q].request_data(6),
        DataStart::InCapsule(vec![9; 512])
    );
    assert_eq!(r.queues[q].request_data(6), DataStart::Gone, "asked once");
}

#[test]
fn a_read_completes_by_its_data_pdu() {
    let (mut r, q) = rig(Digests::default());
    r.cmd(q, rw(io::READ, 8, 0, 1), &[]);
    assert_eq!(r.admits, [(q, 8)]);
    let mut out = Vec::new();
    r.queues[q].c2h_head(8, 512, true, &mut out);
    out.extend_from_slice(&[3; 512]);
    assert!(r.queues[q].finish_silently(8));
    assert_eq!(r.decode(q, &out), [Got::Data(8, vec![3; 512])]);
    assert_eq!(r.queues[q].outstanding(), 0);
}
