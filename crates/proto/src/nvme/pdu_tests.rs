//! Tests of the NVMe/TCP PDU codec: layouts, round trips, bad input.

use proptest::prelude::*;

use super::cmd::{sgl, Cqe, Sgl, Sqe, Status};
use super::decode::{Decoded, Decoder, Fatal, Role};
use super::pdu::*;

fn ctrl(d: Option<Digests>) -> Decoder {
    Decoder {
        role: Role::Controller,
        digests: d,
        max_data: 8192,
    }
}

fn host(d: Option<Digests>) -> Decoder {
    Decoder {
        role: Role::Host,
        digests: d,
        max_data: 1 << 20,
    }
}

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn enc(p: &Pdu<'_>, f: Framing) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode(&mut v, f);
    v
}

fn err(d: &Decoder, b: &[u8]) -> Fatal {
    match d.decode(b) {
        Err(f) => f,
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

fn icreq() -> Pdu<'static> {
    Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        digests: BOTH,
        maxr2t: 0,
    })
}

#[test]
fn icresp_layout() {
    let b = enc(
        &Pdu::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            digests: BOTH,
            maxh2cdata: 0x2_0000,
        }),
        Framing::default(),
    );
    assert_eq!(b.len(), 128);
    assert_eq!(&b[..8], &[1, 0, 128, 0, 128, 0, 0, 0]);
    assert_eq!(b[11], 3);
    assert_eq!(&b[12..16], &0x2_0000u32.to_le_bytes());
}

#[test]
fn capsule_with_data_and_digests_layout() {
    let sqe = Sqe::new(1, 9);
    let f = Framing {
        digests: BOTH,
        pda: 0,
    };
    let b = enc(&Pdu::CapsuleCmd(sqe, &[7u8; 16]), f);
    // 72 header + 4 hdgst = PDO 76; 16 data; 4 ddgst.
    assert_eq!(&b[..4], &[4, 3, 72, 76]);
    assert_eq!(b.len(), 96);
    assert_eq!(&b[4..8], &96u32.to_le_bytes());
    assert_eq!(&b[72..76], &crc32c(&b[..72]).to_le_bytes());
    assert_eq!(&b[92..96], &crc32c(&[7u8; 16]).to_le_bytes());
    let Ok(Decoded::Pdu { pdu, len, .. }) = ctrl(Some(BOTH)).decode(&b) else {
        panic!("decode")
    };
    assert_eq!(len, 96);
    assert_eq!(pdu, Pdu::CapsuleCmd(sqe, &[7u8; 16]));
}

#[test]
fn c2h_head_matches_whole_encoding() {
    let f = Framing {
        digests: BOTH,
        pda: 3,
    };
    let h = DataHdr {
        cccid: 5,
        ttag: 0,
        datao: 4096,
        last: true,
        success: true,
    };
    let data = [0xA5u8; 100];
    let whole = enc(&Pdu::C2HData(h, &data), f);
    let mut head = Vec::new();
    encode_c2h_data_head(&mut head, f, h, data.len());
    assert_eq!(&whole[..head.len()], &head[..]);
    assert_eq!(head.len(), 32); // 24 + 4 digest, aligned to 16 bytes
    let h2c = DataHdr {
        success: false,
        ..h
    };
    let whole = enc(&Pdu::H2CData(h2c, &data), f);
    head.clear();
    encode_h2c_data_head(&mut head, f, h2c, data.len());
    assert_eq!(&whole[..head.len()], &head[..], "the host's side");
}

/// The data heads, laid out by hand, are the heads the whole-PDU encoder
/// writes, in every framing.
#[test]
fn data_heads_match_whole_pdus_in_every_framing() {
    let data = [0x5Au8; 4100];
    for (header, ddgst) in [(false, false), (true, false), (false, true), (true, true)] {
        for pda in 0..32u8 {
            let f = Framing {
                digests: Digests {
                    header,
                    data: ddgst,
                },
                pda,
            };
            for len in [0, 1, 3, 100, 4096, 4100] {
                for (last, success) in [(false, false), (true, false), (true, true)] {
                    let h = DataHdr {
                        cccid: 0x1234,
                        ttag: 0xBEEF,
                        datao: 0x0102_0304,
                        last,
                        success,
                    };
                    let whole = enc(&Pdu::C2HData(h, &data[..len]), f);
                    let mut head = Vec::new();
                    encode_c2h_data_head(&mut head, f, h, len);
                    assert_eq!(&whole[..head.len()], &head[..], "{f:?} {len} {h:?}");
                    assert_eq!(head.len() + len + f.digests.data_len(len), whole.len());
                    let whole = enc(&Pdu::H2CData(h, &data[..len]), f);
                    head.clear();
                    encode_h2c_data_head(&mut head, f, h, len);
                    assert_eq!(&whole[..head.len()], &head[..], "{f:?} {len} {h:?}");
                    assert_eq!(head.len() + len + f.digests.data_len(len), whole.len());
                }
            }
        }
    }
}

#[test]
fn partial_input_asks_for_more() {
    let b = enc(&icreq(), Framing::default());
    let d = ctrl(None);
    assert_eq!(d.decode(&b[..3]), Ok(Decoded::Need(8)));
    assert_eq!(d.decode(&b[..100]), Ok(Decoded::Need(128)));
}

#[test]
fn sequence_errors() {
    let b = enc(&icreq(), Framing::default());
    assert_eq!(
        err(&ctrl(Some(Digests::default())), &b).fes,
        fes::PDU_SEQUENCE_ERROR
    );
    let cap = enc(&Pdu::CapsuleCmd(Sqe::new(0, 0), &[]), Framing::default());
    assert_eq!(err(&ctrl(None), &cap).fes, fes::PDU_SEQUENCE_ERROR);
    // A TermReq is in sequence at any time.
    let t = enc(
        &Pdu::H2CTerm(TermReq {
            fes: 1,
            fei: 0,
            data: &[],
        }),
        Framing::default(),
    );
    assert!(matches!(ctrl(None).decode(&t), Ok(Decoded::Pdu { .. })));
}

#[test]
fn bad_common_headers() {
    let d = ctrl(Some(Digests::default()));
    let mut b = enc(&Pdu::CapsuleCmd(Sqe::new(0, 0), &[]), Framing::default());
    b[0] = 0x42; // unknown type
    assert_eq!(err(&d, &b), Fatal { fes: 1, fei: 0 });
    b[0] = ty::C2H_DATA; // a controller never receives C2H PDUs
    assert_eq!(err(&d, &b).fei, 0);
    b[0] = ty::CAPSULE_CMD;
    b[2] = 71; // HLEN
    assert_eq!(err(&d, &b).fei, 2);
    b[2] = 72;
    b[4..8].copy_from_slice(&10u32.to_le_bytes()); // PLEN below HLEN
    assert_eq!(err(&d, &b).fei, 4);
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes()); // huge: known from 8 bytes
    assert_eq!(err(&d, &b[..8]).fei, 4);
    b[4..8].copy_from_slice(&72u32.to_le_bytes());
    b[1] = flag::HDGST; // digest not negotiated
    assert_eq!(err(&d, &b).fei, 1);
}

#[test]
fn digest_errors() {
    let d = ctrl(Some(BOTH));
    let f = Framing {
        digests: BOTH,
        pda: 0,
    };
    let mut b = enc(&Pdu::CapsuleCmd(Sqe::new(1, 1), &[1, 2, 3, 4]), f);
    let n = b.len();
    b[n - 1] ^= 1; // data digest
    assert!(matches!(
        d.decode(&b),
        Ok(Decoded::Pdu {
            data_digest_ok: false,
            ..
        })
    ));
    b[20] ^= 1; // header byte: header digest
    assert_eq!(err(&d, &b).fes, fes::HEADER_DIGEST_ERROR);
}

#[test]
fn pdo_outside_header_or_data() {
    let d = ctrl(Some(Digests::default()));
    let mut b = enc(
        &Pdu::CapsuleCmd(Sqe::new(1, 1), &[1; 8]),
        Framing::default(),
    );
    b[3] = 8; // inside the header
    assert_eq!(err(&d, &b).fei, 3);
    b[3] = 200; // past PLEN
    assert_eq!(err(&d, &b).fei, 3);
}

#[test]
fn h2c_datal_must_match_and_data_is_bounded() {
    let d = ctrl(Some(Digests::default()));
    let h = DataHdr {
        cccid: 1,
        ttag: 2,
        datao: 0,
        last: true,
        success: false,
    };
    let mut b = enc(&Pdu::H2CData(h, &[9; 64]), Framing::default());
    b[16] = 63;
    assert_eq!(err(&d, &b).fei, 16);
    // Past the limit and any alignment: refused from the common header.
    let big = vec![0u8; 8192 + 129];
    let b = enc(&Pdu::H2CData(h, &big), Framing::default());
    assert_eq!(err(&d, &b[..8]).fei, 4);
    // Just past the limit: refused once the PDO is known.
    let b = enc(&Pdu::H2CData(h, &big[..8193]), Framing::default());
    assert_eq!(err(&d, &b).fes, fes::DATA_LIMIT_EXCEEDED);
}

#[test]
fn icreq_fields_out_of_range() {
    let d = ctrl(None);
    let mut b = enc(&icreq(), Framing::default());
    b[8] = 1; // PFV
    assert_eq!(err(&d, &b).fei, 8);
    b[8] = 0;
    b[10] = 32; // HPDA
    assert_eq!(err(&d, &b).fei, 10);
}

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

/// A PDU of either direction as its kind, fields and data.
#[derive(Debug, Clone)]
struct Spec {
    kind: u8,
    a: u16,
    b: u16,
    c: u32,
    d: u32,
    flags: (bool, bool),
    data: Vec<u8>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0u8..9,
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<(bool, bool)>(),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(kind, a, b, c, d, flags, data)| Spec {
            kind,
            a,
            b,
            c,
            d,
            flags,
            data,
        })
}

/// Builds the PDU; returns it with the role that receives it.
fn build(s: &Spec) -> (Pdu<'_>, Role) {
    let nonempty: &[u8] = if s.data.is_empty() { &[0] } else { &s.data };
    let dh = |h2c: bool| DataHdr {
        cccid: s.a,
        ttag: if h2c { s.b } else { 0 },
        datao: s.c,
        last: s.flags.0 || (!h2c && s.flags.1),
        success: !h2c && s.flags.1,
    };
    let mut sqe = Sqe::new((s.a >> 8) as u8, s.b);
    sqe.set_cdw(10, s.c);
    sqe.set_sgl(Sgl {
        address: 0,
        length: s.data.len() as u32,
        id: sgl::DATA_BLOCK_OFFSET,
    });
    let term = TermReq {
        fes: s.a,
        fei: s.c,
        data: &s.data[..s.data.len().min(TERM_MAX_DATA)],
    };
    match s.kind {
        0 => (
            Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: (s.a % 32) as u8,
                digests: Digests::from_byte(s.b as u8 & 3),
                maxr2t: s.c,
            }),
            Role::Controller,
        ),
        1 => (
            Pdu::IcResp(IcResp {
                pfv: 0,
                cpda: (s.a % 32) as u8,
                digests: Digests::from_byte(s.b as u8 & 3),
                maxh2cdata: 4096 + (s.c % 1024) * 4,
            }),
            Role::Host,
        ),
        2 => (Pdu::H2CTerm(term), Role::Controller),
        3 => (Pdu::C2HTerm(term), Role::Host),
        4 => (Pdu::CapsuleCmd(sqe, &s.data), Role::Controller),
        5 => (
            Pdu::CapsuleResp(Cqe {
                result: u64::from(s.c) << 7,
                sqhd: s.a,
                sqid: s.b,
                cid: s.a ^ s.b,
                status: Status::from_field(s.b & 0xFFFE),
            }),
            Role::Host,
        ),
        6 => (Pdu::H2CData(dh(true), nonempty), Role::Controller),
        7 => (Pdu::C2HData(dh(false), nonempty), Role::Host),
        _ => (
            Pdu::R2T(R2t {
                cccid: s.a,
                ttag: s.b,
                r2to: s.c,
                r2tl: s.d,
            }),
            Role::Host,
        ),
    }
}

proptest! {
    /// Every PDU decodes to itself under any digests and alignment, and
    /// in one piece exactly as long as it was encoded.
    #[test]
    fn pdus_round_trip(s in spec(), dg in digests(), pda in 0u8..32) {
        let (pdu, role) = build(&s);
        let f = Framing { digests: dg, pda };
        let bytes = enc(&pdu, f);
        let ic = matches!(pdu, Pdu::IcReq(_) | Pdu::IcResp(_));
        let d = Decoder { role, digests: (!ic).then_some(dg), max_data: 4096 };
        let got = d.decode(&bytes);
        prop_assert_eq!(got, Ok(Decoded::Pdu { pdu, len: bytes.len(), data_digest_ok: true }));
        for cut in [0, 1, 7, 8, bytes.len() - 1] {
            prop_assert!(matches!(d.decode(&bytes[..cut]), Ok(Decoded::Need(n)) if n > cut));
        }
    }

    /// Arbitrary bytes never panic either decoder, whatever was negotiated,
    /// and a decoded PDU never claims more bytes than it was given.
    #[test]
    fn junk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                         dg in proptest::option::of(digests())) {
        for d in [ctrl(dg), host(dg)] {
            if let Ok(Decoded::Pdu { len, .. }) = d.decode(&bytes) {
                prop_assert!(len <= bytes.len());
            }
        }
    }
}
