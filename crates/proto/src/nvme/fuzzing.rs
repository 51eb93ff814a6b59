//! The NVMe/TCP fuzz harnesses, in the library so the cargo-fuzz targets
//! (`fuzz/fuzz_targets/nvme_decode.rs`, `nvme_queue.rs`) and the corpus
//! replay run the same code.

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

/// Feeds the stream to a controller's queue and target, as a driver would
/// (every data command admitted, every IO done at once), in pieces the data
/// chooses. Panics only on a broken invariant: a queue holding more
/// commands than it may, or consuming more than it was given.
pub fn run_queue(data: &[u8]) {
    use super::ctrl::{Limits, Namespace, Subsystem, Target};
    use super::queue::Queue;
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let nqn = "nqn.2026-11.io.iopace:default";
    let sub = Subsystem {
        nqn: nqn.into(),
        serial: "fuzz".into(),
        model: "fuzz".into(),
        namespaces: vec![Namespace::new(1, 1 << 20, 9, nqn)],
        hosts: None,
    };
    let mut target = Target::new(vec![sub], Vec::new(), Limits::default());
    // The top bit: a queue whose READs and WRITEs the driver serves.
    let mut q = if cut & 0x80 != 0 {
        Queue::external(Limits::default())
    } else {
        Queue::new(Limits::default(), cut & 1 == 0)
    };
    let step = 1 + usize::from((cut & 0x7f) >> 1);
    let mut buf: Vec<u8> = Vec::new();
    let mut now = 0;
    for chunk in rest.chunks(step) {
        buf.extend_from_slice(chunk);
        let (used, _) = q.receive(&buf);
        assert!(used <= buf.len(), "the queue used more than it was given");
        now += 1_000_000;
        let mut first = true;
        loop {
            let actions = q.take_actions();
            if actions.is_empty() {
                break;
            }
            for a in actions {
                act(&mut q, &mut target, a, now, used, first);
            }
            first = false;
        }
        buf.drain(..used);
        let depth = q.bound().map_or(1, |b| usize::from(b.queue_size));
        assert!(
            q.outstanding() <= depth,
            "more commands than the queue holds"
        );
        let _ = q.take_output();
        target.tick(now);
    }
}

/// Answers one of the queue's actions as a driver would (`run_queue`):
/// `used` bytes were given to `receive`, and `first` says the actions came
/// from it (data ranges may come only then).
fn act(
    q: &mut super::queue::Queue,
    target: &mut super::ctrl::Target,
    a: super::queue::Action,
    now: u64,
    used: usize,
    first: bool,
) {
    use super::queue::{Action, DataStart, DevOp};
    use crate::nvme::Status;
    match a {
        Action::Data { at, len, .. } => {
            assert!(first, "data ranges come only from receive");
            assert!(at + len as usize <= used, "data outside the PDUs used");
        }
        Action::DataIn { cid, .. } => {
            q.finish_external(cid, Status::SUCCESS, &mut Vec::new());
        }
        Action::Admit { cid, len, write } if external(q, cid) => {
            let mut out = Vec::new();
            if !write {
                // Half the READs complete by the SUCCESS flag.
                q.c2h_head(cid, len, cid & 1 == 0, &mut out);
                if cid & 1 == 0 {
                    q.finish_silently(cid);
                } else {
                    q.finish_external(cid, Status::SUCCESS, &mut out);
                }
            } else if let DataStart::InCapsule(_) = q.request_data(cid) {
                q.finish_external(cid, Status::SUCCESS, &mut out);
            }
        }
        Action::Connect { cid, sqe, data } => {
            let r = target.connect(&sqe, &data, now);
            q.connected(cid, r);
        }
        Action::Admin { cid, cntlid, sqe } => {
            let d = target.admin(cntlid, &sqe, now);
            q.admin_done(cid, d);
            for (aer, d) in target.take_events_of(cntlid) {
                q.aer_end(aer, d);
            }
        }
        Action::Admit { cid, .. } => q.admit(cid),
        Action::Io { cid, op, .. } => {
            let r = match op {
                DevOp::Read { len, .. } => Ok(vec![0xA5; len as usize]),
                _ => Ok(Vec::new()),
            };
            q.io_done(cid, r);
        }
        Action::DropAer { cid, cntlid } => target.drop_async_event(cntlid, cid),
        Action::Close => {}
    }
}

/// Whether the queue serves `cid` externally (a READ or WRITE of an
/// external queue): its admission is answered by `request_data` or
/// `finish_external`, not `admit`.
fn external(q: &crate::nvme::queue::Queue, cid: u16) -> bool {
    q.is_external()
        && q.io_cmd(cid).is_some_and(|io| {
            matches!(
                io.op,
                crate::nvme::ctrl::IoOp::Read | crate::nvme::ctrl::IoOp::Write
            )
        })
}
