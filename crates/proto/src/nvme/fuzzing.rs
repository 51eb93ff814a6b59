//! The NVMe/TCP fuzz harness, in the library so the cargo-fuzz target
//! (`fuzz/fuzz_targets/nvme_decode.rs`) and the corpus replay run the same code.

use super::decode::{Decoded, Decoder, Role};
use super::pdu::{Digests, Framing, Pdu};

/// The first byte picks the role and what was negotiated; the rest is a
/// stream of PDUs. Each decoded PDU is encoded again and must decode to
/// itself. Panics only on a broken invariant. Returns how many PDUs decoded.
pub fn run(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let role = if mode & 1 == 0 {
        Role::Controller
    } else {
        Role::Host
    };
    let mut d = Decoder::new(role, 1 << 16);
    if mode & 2 != 0 {
        d.digests = Some(Digests::from_byte(mode >> 2));
    }
    let (mut pos, mut n) = (0, 0);
    while pos < rest.len() {
        let Ok(Decoded::Pdu { pdu, len, .. }) = d.decode(&rest[pos..]) else {
            break;
        };
        n += 1;
        assert!(len > 0 && pos + len <= rest.len(), "a PDU past its input");
        check_round_trip(&d, pdu);
        if let Pdu::IcReq(r) = pdu {
            d.digests = Some(r.digests);
        } else if let Pdu::IcResp(r) = pdu {
            d.digests = Some(r.digests);
        }
        pos += len;
    }
    n
}

fn check_round_trip(d: &Decoder, pdu: Pdu<'_>) {
    let f = Framing {
        digests: d.digests.unwrap_or_default(),
        pda: 0,
    };
    let mut out = Vec::new();
    pdu.encode(&mut out, f);
    match d.decode(&out) {
        Ok(Decoded::Pdu {
            pdu: again, len, ..
        }) => {
            assert_eq!(again, pdu, "re-encoded PDU decodes differently");
            assert_eq!(len, out.len());
        }
        other => panic!("re-encoded {pdu:?} does not decode: {other:?}"),
    }
}
