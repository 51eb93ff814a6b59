//! Random commands and data PDUs into an admin and an IO queue: nothing
//! panics, everything the queue sends decodes, and it never holds more
//! commands than its depth.

use proptest::prelude::*;

use super::tests::Rig;
use crate::nvme::cmd::{Sgl, Sqe};
use crate::nvme::pdu::{DataHdr, Digests, Pdu};

#[derive(Debug, Clone)]
enum Step {
    Cmd {
        admin: bool,
        opc: u8,
        cid: u16,
        nsid: u32,
        cdw: [u32; 6],
        sgl: (u64, u32, u8),
        data: usize,
    },
    Data {
        cid: u16,
        ttag: u16,
        datao: u32,
        len: usize,
        last: bool,
    },
    Admit,
}

fn step() -> impl Strategy<Value = Step> {
    let opc = prop_oneof![
        Just(0u8),
        Just(1),
        Just(2),
        Just(6),
        Just(8),
        Just(9),
        Just(0x0A),
        Just(0x0C),
        Just(0x18),
        Just(0x7F),
        any::<u8>()
    ];
    let sgl_id = prop_oneof![Just(0x01u8), Just(0x5A), any::<u8>()];
    prop_oneof![
        4 => (any::<bool>(), opc, 0u16..40, 0u32..3, any::<[u32; 6]>(), (0u64..2, 0u32..20_000, sgl_id), 0usize..5000)
            .prop_map(|(admin, opc, cid, nsid, cdw, sgl, data)| Step::Cmd { admin, opc, cid, nsid, cdw, sgl, data }),
        2 => (0u16..40, 0u16..4, 0u32..9000, 1usize..9000, any::<bool>())
            .prop_map(|(cid, ttag, datao, len, last)| Step::Data { cid, ttag, datao, len, last }),
        1 => Just(Step::Admit),
    ]
}

proptest! {
    #[test]
    fn random_commands_keep_the_books(steps in proptest::collection::vec(step(), 1..60), admit in any::<bool>()) {
        let mut r = Rig::new();
        let (a, q, _) = r.io_queue(Digests::default());
        r.admit = admit;
        for s in steps {
            match s {
                Step::Cmd { admin, opc, cid, nsid, cdw, sgl, data } => {
                    let at = if admin { a } else { q };
                    let mut e = Sqe::new(opc, cid);
                    e.set_nsid(nsid);
                    for (i, v) in cdw.iter().enumerate() {
                        e.set_cdw(10 + i, *v & 0x00FF_FFFF);
                    }
                    e.set_sgl(Sgl { address: sgl.0, length: sgl.1, id: sgl.2 });
                    let _ = r.cmd(at, e, &vec![7u8; data]);
                }
                Step::Data { cid, ttag, datao, len, last } => {
                    let h = DataHdr { cccid: cid, ttag, datao, last, success: false };
                    let _ = r.send(q, Pdu::H2CData(h, &vec![1u8; len]));
                }
                Step::Admit => {
                    for (qi, cid) in std::mem::take(&mut r.admits) {
                        r.queues[qi].admit(cid);
                        let _ = r.drive(qi);
                    }
                }
            }
            for i in [a, q] {
                let depth = r.queues[i].bound().map_or(1, |b| usize::from(b.queue_size));
                prop_assert!(r.queues[i].outstanding() <= depth);
            }
            if r.closed[q] || r.closed[a] {
                break;
            }
        }
    }
}
