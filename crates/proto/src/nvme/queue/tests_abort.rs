//! Abort of IO commands, and namespace attribute notices, through the
//! target and a rig that drives the queues as the engine does.

use super::tests::{resp, rw, sqe, Got, Rig};
use crate::nvme::cmd::{admin, io, Sqe, Status};
use crate::nvme::ctrl::{IoAbort, MAX_ABORTS};
use crate::nvme::pdu::Digests;

fn abort(cid: u16, sqid: u16, of: u16) -> Sqe {
    let mut s = sqe(admin::ABORT, cid, 0, 0);
    s.set_cdw(10, u32::from(sqid) | (u32::from(of) << 16));
    s
}

/// The completions among what came back: (cid, status, dword 0).
fn completions(got: &[Got]) -> Vec<(u16, Status, u64)> {
    let mut c: Vec<_> = got
        .iter()
        .filter_map(|g| match g {
            Got::Resp(c) => Some((c.cid, c.status, c.result)),
            _ => None,
        })
        .collect();
    c.sort_by_key(|g| g.0);
    c
}

/// The target's events for the admin queue `a` reach it, as the engine's
/// tick delivers them.
fn deliver(r: &mut Rig, a: usize, cntlid: u16) -> Vec<Got> {
    for (cid, d) in r.target.take_events_of(cntlid) {
        r.queues[a].aer_end(cid, d);
    }
    r.drive(a)
}

#[test]
fn an_abort_of_a_waiting_io_command_parks_until_its_queue_says() {
    let mut r = Rig::new();
    r.admit = false;
    let (a, q, cntlid) = r.io_queue(Digests::default());
    // Two READs wait for the pacer's admission.
    assert!(r.cmd(q, rw(io::READ, 5, 0, 8), &[]).is_empty());
    assert!(r.cmd(q, rw(io::READ, 6, 8, 8), &[]).is_empty());
    assert_eq!(r.admits, [(q, 5), (q, 6)]);
    // Abort READ 5 on SQ 1: the Abort parks, for the IO queue's driver.
    assert!(r.cmd(a, abort(20, 1, 5), &[]).is_empty());
    assert_eq!(r.target.mail(), 1);
    let want = IoAbort {
        cntlid,
        sqid: 1,
        cid: 5,
        abort_cid: 20,
    };
    assert_eq!(r.target.take_io_aborts_of(cntlid, 1), [want]);
    // The driver finds it waiting: aborted by request.
    assert!(r.queues[q].abort_cmd(5));
    assert!(!r.queues[q].abort_cmd(5), "gone");
    let got = completions(&r.drive(q));
    assert_eq!(got, [(5, Status::ABORT_REQUESTED, 0)]);
    r.target.io_abort_done(cntlid, 20, true);
    assert_eq!(
        completions(&deliver(&mut r, a, cntlid)),
        [(20, Status::SUCCESS, 0)]
    );
    // READ 6 was admitted and ran: its Abort finds it gone, "not aborted".
    r.queues[q].admit(6);
    assert_eq!(resp(&r.drive(q)).status, Status::SUCCESS);
    assert!(r.cmd(a, abort(21, 1, 6), &[]).is_empty());
    assert_eq!(r.target.take_io_aborts_of(cntlid, 1).len(), 1);
    r.target.io_abort_done(cntlid, 21, false);
    assert_eq!(
        completions(&deliver(&mut r, a, cntlid)),
        [(21, Status::SUCCESS, 1)]
    );
    assert_eq!(r.target.mail(), 0);
}

#[test]
fn aborts_park_to_the_limit_and_end_with_their_queue_or_a_reset() {
    let mut r = Rig::new();
    let (a, _q, cntlid) = r.io_queue(Digests::default());
    // An unknown SQ: "not aborted" at once.
    assert_eq!(
        completions(&r.cmd(a, abort(9, 7, 1), &[])),
        [(9, Status::SUCCESS, 1)]
    );
    let n = u16::from(MAX_ABORTS);
    for i in 0..n {
        assert!(r.cmd(a, abort(10 + i, 1, i), &[]).is_empty());
    }
    let c = resp(&r.cmd(a, abort(30, 1, 99), &[]));
    assert_eq!((c.cid, c.status), (30, Status::ABORT_LIMIT));
    // One taken by the driver, which has not answered; the IO queue then
    // closes: every Abort of it completes, "not aborted".
    assert_eq!(r.target.take_io_aborts_of(cntlid, 1).len(), usize::from(n));
    r.target.queue_closed(cntlid, 1);
    let got = completions(&deliver(&mut r, a, cntlid));
    let want: Vec<_> = (0..n).map(|i| (10 + i, Status::SUCCESS, 1)).collect();
    assert_eq!(got, want);
    // A late answer for one of them is ignored.
    r.target.io_abort_done(cntlid, 10, true);
    assert!(r.target.take_events_of(cntlid).is_empty());
    assert_eq!(r.target.mail(), 0);
}

#[test]
fn a_reset_lets_parked_aborts_go_with_no_completion() {
    let mut r = Rig::new();
    let (a, _q, cntlid) = r.io_queue(Digests::default());
    assert!(r.cmd(a, abort(10, 1, 3), &[]).is_empty());
    assert_eq!(r.queues[a].outstanding(), 1);
    let mut s = Sqe::new(admin::FABRICS, 23);
    s.0[4] = crate::nvme::cmd::fctype::PROPERTY_SET;
    s.set_cdw(11, 0x14); // CC.EN 0
    assert_eq!(completions(&r.cmd(a, s, &[])), [(23, Status::SUCCESS, 0)]);
    assert_eq!(r.queues[a].outstanding(), 0, "let go");
    assert!(r.target.take_io_aborts_of(cntlid, 1).is_empty());
    assert_eq!(r.target.mail(), 0);
}

#[test]
fn namespace_notices_need_the_hosts_consent_and_wait_for_the_log_read() {
    let mut r = Rig::new();
    let (a, _q, cntlid) = r.io_queue(Digests::default());
    assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, 6, 0, 0), &[]).is_empty());
    // Notices off: the list grows, no event.
    r.target.namespace_changed(0, 1);
    assert!(r.target.take_events_of(cntlid).is_empty());
    let mut s = sqe(admin::SET_FEATURES, 7, 0, 0);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, 1 << 8);
    assert_eq!(resp(&r.cmd(a, s, &[])).status, Status::SUCCESS);
    r.target.namespace_changed(0, 1);
    let got = completions(&deliver(&mut r, a, cntlid));
    assert_eq!(got, [(6, Status::SUCCESS, 0x0004_0002)]);
    // Told once until the log is read: a second change only joins the list.
    assert!(r.cmd(a, sqe(admin::ASYNC_EVENT, 8, 0, 0), &[]).is_empty());
    r.target.namespace_changed(0, 1);
    assert!(r.target.take_events_of(cntlid).is_empty());
    let mut log = sqe(admin::GET_LOG_PAGE, 9, 0xFFFF_FFFF, 4096);
    log.set_cdw(10, 4 | ((4096 / 4 - 1) << 16));
    let got = r.cmd(a, log, &[]);
    let data = got.iter().find_map(|g| match g {
        Got::Data(_, d) => Some(d.clone()),
        _ => None,
    });
    let data = data.expect("the log page");
    assert_eq!(&data[..8], &[1, 0, 0, 0, 0, 0, 0, 0], "namespace 1, once");
    r.target.namespace_changed(0, 1);
    let got = completions(&deliver(&mut r, a, cntlid));
    assert_eq!(got, [(8, Status::SUCCESS, 0x0004_0002)]);
}
