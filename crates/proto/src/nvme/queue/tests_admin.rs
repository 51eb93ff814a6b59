//! The admin queue and the discovery controller, end to end.

use super::tests::{resp, sqe, Got, Rig, NQN};
use crate::nvme::cmd::{admin, fctype, Cqe, Sqe, Status};
use crate::nvme::ctrl::{pages, Limits, DISCOVERY_NQN, MAX_ADMIN_QUEUE, MAX_AERS, VERSION};
use crate::nvme::pdu::Digests;

fn prop_get(r: &mut Rig, q: usize, ofst: u32, eight: bool) -> Cqe {
    let mut s = Sqe::new(admin::FABRICS, 50);
    s.0[4] = fctype::PROPERTY_GET;
    s.0[40] = u8::from(eight);
    s.set_cdw(11, ofst);
    resp(&r.cmd(q, s, &[]))
}

/// An admin command that returns `len` bytes; (data, completion).
fn get(r: &mut Rig, q: usize, s: Sqe) -> (Vec<u8>, Cqe) {
    let got = r.cmd(q, s, &[]);
    let data = got
        .iter()
        .find_map(|g| match g {
            Got::Data(_, d) => Some(d.clone()),
            _ => None,
        })
        .unwrap_or_default();
    (data, resp(&got))
}

fn identify(cid: u16, cns: u32, nsid: u32) -> Sqe {
    let mut s = sqe(admin::IDENTIFY, cid, nsid, 4096);
    s.set_cdw(10, cns);
    s
}

fn log_page(cid: u16, lid: u32, len: u32) -> Sqe {
    let mut s = sqe(admin::GET_LOG_PAGE, cid, 0xFFFF_FFFF, len);
    s.set_cdw(10, lid | ((len / 4 - 1) << 16));
    s
}

#[test]
fn properties_enable_and_shutdown() {
    let mut r = Rig::new();
    let q = r.open(Digests::default());
    let c = r.connect(q, 0, 0xFFFF, NQN);
    assert_eq!(c.status, Status::SUCCESS);
    let cntlid = c.result as u16;
    let cap = prop_get(&mut r, q, 0, true).result;
    assert_eq!(cap & 0xFFFF, 127); // MQES
    assert_eq!((cap >> 37) & 1, 1); // NVM command set
    assert_eq!(prop_get(&mut r, q, 0x08, false).result, u64::from(VERSION));
    assert_eq!(prop_get(&mut r, q, 0, false).status, Status::INVALID_FIELD);
    // Admin commands wait for CC.EN.
    let (_, c) = get(&mut r, q, identify(2, 1, 0));
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR);
    r.enable(q);
    assert_eq!(prop_get(&mut r, q, 0x1C, false).result & 1, 1); // CSTS.RDY
    let mut s = Sqe::new(admin::FABRICS, 51);
    s.0[4] = fctype::PROPERTY_SET;
    s.set_cdw(11, 0x14);
    s.set_cdw(12, 0x0046_0001 | (1 << 14)); // CC.SHN normal
    assert_eq!(resp(&r.cmd(q, s, &[])).status, Status::SUCCESS);
    assert_eq!(prop_get(&mut r, q, 0x1C, false).result & 0b1100, 0b1000);
    assert_eq!(r.target.take_dropped(), vec![cntlid]);
}

/// Property Set CC to `cc` on queue `q`.
fn set_cc(r: &mut Rig, q: usize, cid: u16, cc: u32) {
    let mut s = Sqe::new(admin::FABRICS, cid);
    s.0[4] = fctype::PROPERTY_SET;
    s.set_cdw(11, 0x14);
    s.set_cdw(12, cc);
    assert_eq!(resp(&r.cmd(q, s, &[])).status, Status::SUCCESS);
}

/// A reset (CC.EN 1 to 0) or a shutdown with an IO queue connected is done
/// (CSTS.RDY clear, SHST complete) only once that queue's connection
/// closed, and its QID is not taken anew before: an old connection can
/// neither serve beside a new queue of its id nor, closing, drop it.
#[test]
fn reset_and_shutdown_complete_once_the_io_queues_closed() {
    let mut r = Rig::new();
    let (a, _, cntlid) = r.io_queue(Digests::default());
    set_cc(&mut r, a, 60, 0x0046_0000);
    assert_eq!(prop_get(&mut r, a, 0x1C, false).result & 1, 1, "RDY held");
    assert!(!r.target.queue_live(cntlid, 1), "the old queue must close");
    let q2 = r.open(Digests::default());
    let c = r.connect(q2, 1, cntlid, NQN);
    assert_eq!(c.status, Status::COMMAND_SEQUENCE_ERROR, "disabled");
    r.target.queue_closed(cntlid, 1);
    assert_eq!(prop_get(&mut r, a, 0x1C, false).result & 1, 0, "reset done");
    r.enable(a);
    assert_eq!(r.connect(q2, 1, cntlid, NQN).status, Status::SUCCESS);
    // A host that enables again at once: the QID waits for its old close.
    set_cc(&mut r, a, 61, 0x0046_0000);
    r.enable(a);
    let q3 = r.open(Digests::default());
    let c = r.connect(q3, 1, cntlid, NQN);
    assert_eq!(
        (c.status, c.result),
        (Status::CONNECT_INVALID_PARAMETERS, 42)
    );
    r.target.queue_closed(cntlid, 1);
    assert_eq!(r.connect(q3, 1, cntlid, NQN).status, Status::SUCCESS);
    assert!(r.target.queue_live(cntlid, 1));
    // Shutdown: occurring (01b) while the queue is connected, then complete.
    set_cc(&mut r, a, 62, 0x0046_0001 | (1 << 14));
    assert_eq!(prop_get(&mut r, a, 0x1C, false).result & 0b1100, 0b0100);
    r.target.queue_closed(cntlid, 1);
    assert_eq!(prop_get(&mut r, a, 0x1C, false).result & 0b1100, 0b1000);
}

#[test]
fn identify_and_logs() {
    let mut r = Rig::new();
    let (a, _, cntlid) = r.io_queue(Digests::default());
    let (d, c) = get(&mut r, a, identify(2, 1, 0));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(d.len(), 4096);
    let identify_ctrl = d.clone();
    assert_eq!(u16::from_le_bytes([d[78], d[79]]), cntlid);
    assert_eq!(d[77], Limits::default().mdts());
    assert_eq!(&d[768..768 + NQN.len()], NQN.as_bytes());
    assert_eq!(d[111], 1);
    assert_eq!(d[93], 1, "OAES: namespace attribute notices (bit 8)");
    assert_eq!(d[260], 0b011, "FRMW: one slot, read-only");
    let kelvin = |at: usize| u16::from_le_bytes([d[at], d[at + 1]]);
    assert_eq!((kelvin(266), kelvin(268)), (343, 373), "WCTEMP, CCTEMP");
    assert_eq!(
        d[96],
        1 | 1 << 6,
        "CTRATT: host id, traffic based keep alive"
    );
    // CNS 06h, the NVM command set's controller structure (SPDK hosts ask
    // at attach): all zero, no limits beyond MDTS. Another set: refused.
    let (d, c) = get(&mut r, a, identify(10, 6, 0));
    assert_eq!((c.status, d), (Status::SUCCESS, vec![0; 4096]));
    let mut zns = identify(11, 6, 0);
    zns.set_cdw(11, 2 << 24);
    assert_eq!(get(&mut r, a, zns).1.status, Status::INVALID_FIELD);
    let (d, _) = get(&mut r, a, identify(3, 0, 1));
    assert_eq!(u64::from_le_bytes(d[..8].try_into().unwrap()), 8192);
    assert_eq!(d[130], 9); // LBADS
    assert_eq!(d[33], 1, "DLFEAT: deallocated blocks read as zero");
    let mut ns = r.target.subsystems[0].namespaces[0].clone();
    ns.dealloc_zeroes = false;
    assert_eq!(pages::identify_namespace(Some(&ns), false)[33], 0);
    let (d, _) = get(&mut r, a, identify(4, 2, 0));
    assert_eq!(&d[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let (d, _) = get(&mut r, a, identify(5, 3, 1));
    assert_eq!(&d[..2], &[2, 16]);
    assert_eq!(
        get(&mut r, a, identify(6, 0, 9)).1.status,
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        get(&mut r, a, identify(7, 0x55, 0)).1.status,
        Status::INVALID_FIELD
    );
    // Firmware Slot Information (mandatory): slot 1 active, with FR's revision.
    let (d, c) = get(&mut r, a, log_page(8, 3, 512));
    assert_eq!((c.status, d[0]), (Status::SUCCESS, 1));
    assert_eq!(&d[8..16], &identify_ctrl[64..72]);
    for (lid, len) in [(1, 64), (2, 512), (4, 4096)] {
        let (d, c) = get(&mut r, a, log_page(8, lid, len));
        assert_eq!(
            (c.status, d.len()),
            (Status::SUCCESS, len as usize),
            "log {lid}"
        );
    }
    let (_, c) = get(&mut r, a, log_page(9, 0x70, 1024));
    assert_eq!(c.status, Status::INVALID_LOG_PAGE);
}

#[test]
fn features_keep_alive_aer_abort() {
    let mut r = Rig::new();
    let a = r.open(Digests::default());
    let cntlid = r.connect(a, 0, 0xFFFF, NQN).result as u16;
    r.enable(a);
    let mut s = sqe(admin::SET_FEATURES, 2, 0, 0);
    s.set_cdw(10, 0x07);
    s.set_cdw(11, 3 | (3 << 16)); // 4 queues each
    assert_eq!(resp(&r.cmd(a, s, &[])).result, 3 | (3 << 16));
    let mut s = sqe(admin::GET_FEATURES, 3, 0, 0);
    s.set_cdw(10, 0x0F);
    assert_eq!(resp(&r.cmd(a, s, &[])).result, 0);
    let mut s = sqe(admin::SET_FEATURES, 4, 0, 0);
    s.set_cdw(10, 0x0F);
    s.set_cdw(11, 2000); // 2 s keep-alive
    assert_eq!(resp(&r.cmd(a, s, &[])).status, Status::SUCCESS);
    let mut s = sqe(admin::SET_FEATURES, 5, 0, 0);
    s.set_cdw(10, 0x0B | (1 << 31)); // save: not saveable
    assert_eq!(resp(&r.cmd(a, s, &[])).status, Status::FEATURE_NOT_SAVEABLE);
    // Namespace attribute notices on (Async Event Configuration bit 8).
    let mut s = sqe(admin::SET_FEATURES, 5, 0, 0);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, 1 << 8);
    assert_eq!(resp(&r.cmd(a, s, &[])).status, Status::SUCCESS);
    // An AER parks; a namespace change completes it.
    assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, 6, 0, 0), &[]).is_empty());
    assert_eq!(r.queues[a].outstanding(), 1);
    r.target.namespace_changed(0, 1);
    let evs = r.target.take_events();
    assert_eq!(evs.len(), 1);
    let d = evs[0].2.clone().expect("a completion");
    assert_eq!((evs[0].0, evs[0].1, d.result), (cntlid, 6, 0x0004_0002));
    r.queues[a].admin_done(6, d);
    assert_eq!(resp(&r.drive(a)).result, 0x0004_0002);
    // Its log page read (RAE clear): the next change is told again.
    let (d, _) = get(&mut r, a, log_page(9, 4, 4096));
    assert_eq!(&d[..8], &[1, 0, 0, 0, 0, 0, 0, 0], "namespace 1 changed");
    // A host that reuses a parked AER's id gave it up: no conflict, and
    // a later event does not complete the new command.
    assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, 10, 0, 0), &[]).is_empty());
    let got = r.cmd(a, sqe(admin::KEEP_ALIVE, 10, 0, 0), &[]);
    assert_eq!(resp(&got).status, Status::SUCCESS);
    r.target.namespace_changed(0, 1);
    assert!(r.target.take_events().is_empty());
    // Abort: "not aborted".
    let mut s = sqe(admin::ABORT, 7, 0, 0);
    s.set_cdw(10, 6 << 16);
    assert_eq!(resp(&r.cmd(a, s, &[])).result, 1);
    // Keep alive, then silence past the timeout.
    r.now = 1_500_000_000;
    assert_eq!(
        resp(&r.cmd(a, sqe(admin::KEEP_ALIVE, 8, 0, 0), &[])).status,
        Status::SUCCESS
    );
    r.target.tick(3_400_000_000);
    assert!(r.target.alive(cntlid));
    assert_eq!(r.target.next_deadline(), Some(3_500_000_000));
    // Its I/O queues' commands restart the timer too (traffic based).
    r.target.traffic(cntlid, 3_000_000_000);
    r.target.tick(4_900_000_000);
    assert!(r.target.alive(cntlid));
    assert_eq!(r.target.next_deadline(), Some(5_000_000_000));
    r.target.tick(5_000_000_000);
    assert!(!r.target.alive(cntlid));
    assert_eq!(r.target.take_dropped(), vec![cntlid]);
}

#[test]
fn discovery_lists_what_the_host_may_see() {
    let mut r = Rig::new();
    let mut other = r.target.subsystems[0].clone();
    other.nqn = "nqn.2026-11.io.iopace:private".into();
    other.hosts = Some(vec!["nqn.someone-else".into()]);
    r.target.subsystems.push(other);
    let q = r.open(Digests::default());
    let c = r.connect(q, 0, 0xFFFF, DISCOVERY_NQN);
    assert_eq!(c.status, Status::SUCCESS);
    r.enable(q);
    let (d, _) = get(&mut r, q, identify(2, 1, 0));
    assert_eq!(d[111], 2); // a discovery controller
    assert_eq!(&d[92..96], &[0; 4], "OAES: no namespaces, no notices");
    let (d, c) = get(&mut r, q, log_page(3, 0x70, 4096));
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(u64::from_le_bytes(d[8..16].try_into().unwrap()), 1);
    let e = &d[1024..2048];
    assert_eq!((e[0], e[1], e[2]), (3, 1, 2));
    assert_eq!(&e[32..36], b"4420");
    assert_eq!(&e[256..256 + NQN.len()], NQN.as_bytes());
    assert_eq!(&e[512..521], b"127.0.0.1");
    assert_eq!(u16::from_le_bytes([e[8], e[9]]), MAX_ADMIN_QUEUE, "ASQSZ");
    // The discovery controller has no IO queues and no namespaces.
    let (_, c) = get(&mut r, q, identify(4, 0, 1));
    assert_eq!(c.status, Status::INVALID_NAMESPACE);
    let q2 = r.open(Digests::default());
    let c = r.connect(q2, 1, 1, DISCOVERY_NQN);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAMETERS);
    // A host not on the list cannot connect to the private subsystem.
    let c = r.connect(q2, 0, 0xFFFF, "nqn.2026-11.io.iopace:private");
    assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
}

#[test]
fn read_only_host_sees_write_protection() {
    let mut r = Rig::new();
    r.access = Some(crate::Access::ReadOnly);
    let (a, q, _) = r.io_queue(Digests::default());
    let (d, _) = get(&mut r, a, identify(2, 0, 1));
    assert_eq!(d[99] & 1, 1, "NSATTR write protected");
    let w = super::tests::in_capsule(super::tests::rw(crate::nvme::cmd::io::WRITE, 3, 0, 1), 512);
    let got = r.cmd(q, w, &[1; 512]);
    assert_eq!(resp(&got).status, Status::NAMESPACE_WRITE_PROTECTED);
    let got = r.cmd(
        q,
        super::tests::rw(crate::nvme::cmd::io::READ, 4, 0, 1),
        &[],
    );
    assert_eq!(resp(&got).status, Status::SUCCESS);
    r.access = Some(crate::Access::Denied);
    let q2 = r.open(Digests::default());
    assert_eq!(
        r.connect(q2, 0, 0xFFFF, NQN).status,
        Status::CONNECT_INVALID_HOST
    );
}

fn abort(cid: u16, sqid: u16, of: u16) -> Sqe {
    let mut s = sqe(admin::ABORT, cid, 0, 0);
    s.set_cdw(10, u32::from(sqid) | (u32::from(of) << 16));
    s
}

/// The completions among what came back: (cid, status, dword 0).
fn completions(got: &[Got]) -> Vec<(u16, Status, u64)> {
    got.iter()
        .filter_map(|g| match g {
            Got::Resp(c) => Some((c.cid, c.status, c.result)),
            _ => None,
        })
        .collect()
}

/// Async Event Requests: held up to the AERL that Identify Controller
/// advertises, one more refused; an Abort of a held one completes it with
/// Command Abort Requested (the Abort's dword 0 bit 0 clear), an Abort of
/// anything else is "not aborted" (bit 0 set); a reset lets go of the rest
/// with no completion (hosts cancel their own then: a late completion is an
/// error to Linux's and SPDK's), as does the admin queue's end.
#[test]
fn aers_held_to_the_limit_then_aborted_reset_or_dropped() {
    let mut r = Rig::new();
    let a = r.open(Digests::default());
    let cntlid = r.connect(a, 0, 0xFFFF, NQN).result as u16;
    r.enable(a);
    let (d, _) = get(&mut r, a, identify(2, 1, 0));
    assert_eq!(usize::from(d[259]) + 1, MAX_AERS, "AERL, 0's based");
    for cid in 10..10 + MAX_AERS as u16 {
        assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, cid, 0, 0), &[]).is_empty());
    }
    assert_eq!(r.queues[a].outstanding(), MAX_AERS);
    let c = resp(&r.cmd(a, sqe(admin::ASYNC_EVENT, 20, 0, 0), &[]));
    assert_eq!((c.cid, c.status), (20, Status::ASYNC_EVENT_LIMIT));
    // Abort the held AER 11: both complete.
    let mut got = completions(&r.cmd(a, abort(21, 0, 11), &[]));
    got.sort_by_key(|g| g.0);
    assert_eq!(
        got,
        vec![(11, Status::ABORT_REQUESTED, 0), (21, Status::SUCCESS, 0)]
    );
    assert_eq!(r.queues[a].outstanding(), MAX_AERS - 1);
    // AER 11 is gone, an IO queue's command 12, no command 99: not aborted.
    for (sqid, of) in [(0, 11), (1, 12), (0, 99)] {
        let got = completions(&r.cmd(a, abort(22, sqid, of), &[]));
        assert_eq!(got, vec![(22, Status::SUCCESS, 1)], "abort {sqid}:{of}");
    }
    // A reset (CC.EN 0): the three left go, with no completion.
    let mut s = Sqe::new(admin::FABRICS, 23);
    s.0[4] = fctype::PROPERTY_SET;
    s.set_cdw(11, 0x14);
    let got = completions(&r.cmd(a, s, &[]));
    assert_eq!(got, vec![(23, Status::SUCCESS, 0)]);
    assert_eq!(r.queues[a].outstanding(), 0);
    assert!(r.target.take_events().is_empty());
    // Enabled again, two held; the admin queue goes: its controller and
    // what it held are let go, and no completion is left for anyone.
    r.enable(a);
    for cid in 30..32 {
        assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, cid, 0, 0), &[]).is_empty());
    }
    r.queues[a].abort_all();
    r.target.queue_closed(cntlid, 0);
    assert!(r.target.controller(cntlid).is_none());
    assert!(r.target.take_events().is_empty());
}

#[test]
fn admin_queues_up_to_4096_entries_and_none_cost_memory_idle() {
    // SPDK's abort tool asks for QD / interval + 8 entries (40 for
    // `abort -q 32 -a 1`); its target takes up to 4096, as the spec does.
    let mut r = Rig::new();
    for (sqsize, ok) in [
        (39, true),
        (127, true),
        (4095, true),
        (4096, false),
        (0, false),
    ] {
        let q = r.open(Digests::default());
        let c = r.connect_sized(q, 0, 0xFFFF, NQN, sqsize);
        let status = if ok {
            Status::SUCCESS
        } else {
            Status::CONNECT_INVALID_PARAMETERS
        };
        assert_eq!(c.status, status, "SQSIZE {sqsize}");
        if !ok {
            assert_eq!(c.result, 44, "SQSIZE {sqsize}: the field's offset");
            continue;
        }
        assert_eq!(r.queues[q].bound().map(|b| b.queue_size), Some(sqsize + 1));
        // Every admin command completes at once: a queue's worth (at most
        // 64) in one go all come back, and it keeps no room per entry.
        r.enable(q);
        let n = (sqsize + 1).min(64);
        let mut burst = Vec::new();
        for cid in 0..n {
            let s = Sqe::new(admin::KEEP_ALIVE, 100 + cid);
            crate::nvme::pdu::Pdu::CapsuleCmd(s, &[])
                .encode(&mut burst, crate::nvme::pdu::Framing::default());
        }
        let got = r.feed(q, &burst);
        let done = got.iter().filter(|g| matches!(g, Got::Resp(_))).count();
        assert_eq!(done, usize::from(n), "SQSIZE {sqsize}");
        assert_eq!(r.queues[q].outstanding(), 0);
        // Room for the burst that was in flight, not for the queue's size.
        let room = r.queues[q].cmds.capacity();
        assert!(room <= 2 * usize::from(n), "SQSIZE {sqsize}: {room}");
    }
}
