//! H2CData taken as its data arrives: a large PDU fed in pieces gives the
//! driver the same data, digest verdict and errors as the whole PDU, and
//! the queue uses every byte it is given but a header or digest cut short.

use proptest::prelude::*;

use super::tests::{h2c, rw, Got, Rig};
use super::{Action, DataStart};
use crate::nvme::cmd::io;
use crate::nvme::pdu::{fes, Digests, Framing, Pdu};

/// An external queue with WRITE 4 of `blocks` blocks whose R2T is out;
/// the rig, the queue and the R2T's TTAG.
fn writing(digests: Digests, blocks: u32) -> (Rig, usize, u16) {
    let mut r = Rig::new();
    r.external = true;
    r.admit = false;
    let (_, q, _) = r.io_queue(digests);
    assert!(r.cmd(q, rw(io::WRITE, 4, 0, blocks), &[]).is_empty());
    assert_eq!(r.queues[q].request_data(4), DataStart::Requested);
    let Got::R2T(t) = r.drive(q)[0].clone() else {
        panic!("no R2T")
    };
    (r, q, t.ttag)
}

/// Feeds `bytes` in pieces of `step` as a driver does (keeping what the
/// queue did not use): the data the Data actions point at, in order, the
/// DataIn verdict, and a TermReq's (FES, FEI) if one was sent.
fn feed(
    r: &mut Rig,
    q: usize,
    bytes: &[u8],
    step: usize,
) -> (Vec<u8>, Option<bool>, Option<(u16, u32)>) {
    let (mut buf, mut data, mut verdict, mut term) = (Vec::new(), Vec::new(), None, None);
    for chunk in bytes.chunks(step) {
        buf.extend_from_slice(chunk);
        let (used, _) = r.queues[q].receive(&buf);
        assert!(used <= buf.len());
        for a in r.queues[q].take_actions() {
            match a {
                Action::Data { datao, at, len, .. } => {
                    assert_eq!(datao as usize, data.len(), "in order");
                    assert!(at + len as usize <= used, "inside what was used");
                    data.extend_from_slice(&buf[at..at + len as usize]);
                }
                Action::DataIn { ok, .. } => verdict = Some(ok),
                _ => {}
            }
        }
        let out = r.queues[q].take_output();
        for g in r.decode(q, &out) {
            if let Got::Term(f, i) = g {
                term = Some((f, i));
            }
        }
        buf.drain(..used);
        assert!(
            buf.len() < 72 + 32,
            "only a header or digest is kept: {}",
            buf.len()
        );
    }
    (data, verdict, term)
}

/// A queue writing (`writing`, 16 blocks) and the one H2CData PDU of its
/// 8 KiB of data, framed with `digests`; `flip` breaks its data digest.
fn one_pdu(digests: Digests, flip: bool) -> (Rig, usize, Vec<u8>, Vec<u8>) {
    let (r, q, ttag) = writing(digests, 16);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut b = Vec::new();
    Pdu::H2CData(h2c(4, ttag, 0, true), &data).encode(&mut b, Framing { digests, pda: 0 });
    let last = b.len() - 1;
    if flip && digests.data {
        b[last] ^= 1;
    }
    (r, q, data, b)
}

proptest! {
    #[test]
    fn pieces_give_what_the_whole_pdu_gives(step in 1usize..3000, header in any::<bool>(),
                                             data_dg in any::<bool>(), flip in any::<bool>()) {
        let (mut r, q, data, b) = one_pdu(Digests { header, data: data_dg }, flip);
        let (got, verdict, term) = feed(&mut r, q, &b, step);
        prop_assert_eq!(got, data);
        prop_assert_eq!(verdict, Some(!(flip && data_dg)));
        prop_assert_eq!(term, None);
    }

    #[test]
    fn a_bad_header_in_pieces_is_the_same_fatal_error(step in 1usize..200, which in 0u8..3) {
        let (mut r, q, ttag) = writing(Digests::default(), 16);
        let mut b = Vec::new();
        let (cid, tt, datao) = match which {
            0 => (9, ttag, 0),        // no such command
            1 => (4, ttag ^ 1, 0),    // wrong TTAG
            _ => (4, ttag, 512),      // not where the data is
        };
        Pdu::H2CData(h2c(cid, tt, datao, false), &[1; 4096]).encode(&mut b, Framing::default());
        let (mut whole, q2, _) = writing(Digests::default(), 16);
        let want = feed(&mut whole, q2, &b, b.len()).2;
        prop_assert!(want.is_some());
        let (data, _, term) = feed(&mut r, q, &b, step);
        prop_assert!(data.is_empty());
        prop_assert_eq!(term, want);
    }
}

#[test]
fn two_pdus_of_one_write_stream_one_after_the_other() {
    let (mut r, q, ttag) = writing(
        Digests {
            header: true,
            data: true,
        },
        32,
    );
    let data: Vec<u8> = (0..16384u32).map(|i| (i % 253) as u8).collect();
    let framing = Framing {
        digests: Digests {
            header: true,
            data: true,
        },
        pda: 0,
    };
    let mut b = Vec::new();
    Pdu::H2CData(h2c(4, ttag, 0, false), &data[..8192]).encode(&mut b, framing);
    Pdu::H2CData(h2c(4, ttag, 8192, true), &data[8192..]).encode(&mut b, framing);
    let (got, verdict, term) = feed(&mut r, q, &b, 1000);
    assert_eq!((got, verdict, term), (data, Some(true), None));
    // More data than the R2T asked, in pieces: out of range, as whole.
    let (mut r, q, ttag) = writing(Digests::default(), 1);
    let mut b = Vec::new();
    Pdu::H2CData(h2c(4, ttag, 0, true), &[0; 4096]).encode(&mut b, Framing::default());
    let term = feed(&mut r, q, &b, 100).2;
    assert_eq!(term, Some((fes::DATA_OUT_OF_RANGE, 16)));
}

proptest! {
    /// A driver that receives an H2CData PDU's data into its own buffers
    /// (`inflow`, `landed`) gets the same verdict as one that gives it all
    /// to `receive`, and no `Data` action for the bytes that landed.
    #[test]
    fn data_landed_by_the_driver_counts_as_received(step in 1usize..3000, header in any::<bool>(),
                                                    data_dg in any::<bool>(), flip in any::<bool>()) {
        let (mut r, q, data, b) = one_pdu(Digests { header, data: data_dg }, flip);
        let dd = if data_dg { 4 } else { 0 };
        let head = b.len() - data.len() - dd;
        // The header alone: the data is due, none taken.
        let (used, _) = r.queues[q].receive(&b[..head]);
        prop_assert_eq!(used, head);
        prop_assert_eq!(r.queues[q].inflow(), Some((4, 0, 8192)));
        let mut landed = 0;
        for chunk in data.chunks(step) {
            r.queues[q].landed(chunk);
            landed += chunk.len();
            let due = (8192 - landed) as u32;
            prop_assert_eq!(r.queues[q].inflow(), Some((4, landed as u32, due)));
        }
        let (used, _) = r.queues[q].receive(&b[head + data.len()..]);
        prop_assert_eq!(used, dd);
        prop_assert_eq!(r.queues[q].inflow(), None);
        let actions = r.queues[q].take_actions();
        let copied = actions.iter().filter(|a| matches!(a, Action::Data { .. })).count();
        prop_assert_eq!(copied, 0, "no Data action for bytes that landed");
        let verdict = actions.iter().find_map(|a| match a {
            Action::DataIn { ok, .. } => Some(*ok),
            _ => None,
        });
        prop_assert_eq!(verdict, Some(!(flip && data_dg)));
    }
}
