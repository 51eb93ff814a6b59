//! Abort of IO commands and async events through the engine, sans-IO: the
//! admin queue's Abort reaches the IO queue's commands through the
//! target's mail, as it does across reactors.

use proto::nvme::cmd::{admin, io, Sqe};
use proto::nvme::pdu::Pdu;

use super::nvme_tests::{h2c, io_queue, nvme_net, nvme_net_conf, r2t_of, resps, rw};

/// Abort of command `of` on SQ `sqid`.
fn abort(cid: u16, sqid: u16, of: u16) -> Sqe {
    let mut s = Sqe::new(admin::ABORT, cid);
    s.set_cdw(10, u32::from(sqid) | (u32::from(of) << 16));
    s
}

const ABORTED: u16 = 0x007; // SCT 0, SC 07h: Command Abort Requested
const ABORTED_DW0: u32 = 0; // the Abort's dword 0 bit 0: aborted
const NOT_ABORTED: u32 = 1;

#[test]
fn an_abort_ends_a_write_waiting_for_buffers_and_one_waiting_for_its_data() {
    // 16 buffers: the IO queue commits at most 4, so WRITE 2 waits (no
    // slot, no R2T) behind WRITE 1, whose R2T is out.
    let mut net = nvme_net("buffers", 16);
    let (mut a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 1, 0, 16384), &[]));
    q.send(
        &mut net,
        Pdu::CapsuleCmd(rw(io::WRITE, 2, 16384, 16384), &[]),
    );
    net.run_to_quiet();
    let (cid, ttag, _) = r2t_of(&q.drain(&net)[0].1);
    assert_eq!(cid, 1);
    // Abort WRITE 2: it completes at once as aborted, and so does the Abort.
    a.send(&mut net, Pdu::CapsuleCmd(abort(20, 1, 2), &[]));
    net.run_to_quiet();
    assert_eq!(resps(&q.drain(&net)), [(2, ABORTED, 0)]);
    assert_eq!(resps(&a.drain(&net)), [(20, 0, ABORTED_DW0)]);
    // Abort WRITE 1, whose R2T is out: aborted, but it completes once the
    // data the host sends anyway is in; it never reaches the device.
    a.send(&mut net, Pdu::CapsuleCmd(abort(21, 1, 1), &[]));
    net.run_to_quiet();
    assert_eq!(resps(&a.drain(&net)), [(21, 0, ABORTED_DW0)]);
    assert!(q.drain(&net).is_empty(), "its data is still due");
    assert_eq!(net.engine.buffers_in_use(), 4);
    q.send(&mut net, h2c(cid, ttag, &[7; 16384]));
    net.run_to_quiet();
    assert_eq!(resps(&q.drain(&net)), [(1, ABORTED, 0)]);
    // Neither reached the device: what they would have written is not there.
    for (cid, at) in [(3, 0), (4, 16384)] {
        q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, cid, at, 16384), &[]));
        net.run_to_quiet();
        let got = q.drain(&net);
        assert_eq!(got[0].0, 7, "C2HData");
        assert!(got[0].1[24..].iter().all(|&b| b == 0), "nothing written");
    }
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    net.engine.audit().expect("books balance");
}

#[test]
fn an_abort_ends_a_read_in_the_pacer_and_not_one_at_the_device() {
    // One 4 KiB credit per 100 ms: the first READ (16 KiB) goes into
    // debt, the second waits in the pacer.
    let pacing = "period_us = 100000\ncredit = 4096\nburst = 1\n";
    let mut net = nvme_net_conf("rate", 64, "", pacing);
    let (mut a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 5, 0, 16384), &[]));
    net.deliver(q.conn, usize::MAX);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 6, 4096, 4096), &[]));
    net.deliver(q.conn, usize::MAX);
    assert_eq!(net.ios.len(), 1, "READ 5 at the device, READ 6 paced");
    assert_eq!(net.engine.io.pacer().queued(), 1);
    // Abort both: READ 6 is aborted; READ 5, at the device, is not.
    a.send(&mut net, Pdu::CapsuleCmd(abort(20, 1, 6), &[]));
    a.send(&mut net, Pdu::CapsuleCmd(abort(21, 1, 5), &[]));
    for _ in 0..4 {
        net.deliver(a.conn, usize::MAX);
        net.advance(1_000);
        net.take_sent(a.conn, usize::MAX);
    }
    assert_eq!(net.engine.io.pacer().queued(), 0);
    assert_eq!(
        resps(&a.drain(&net)),
        [(20, 0, ABORTED_DW0), (21, 0, NOT_ABORTED)]
    );
    net.run_to_quiet();
    let got = q.drain(&net);
    assert_eq!(resps(&got), [(6, ABORTED, 0)]);
    assert!(got.iter().any(|p| p.0 == 7), "READ 5's data came");
    // One not there at all: not aborted.
    a.send(&mut net, Pdu::CapsuleCmd(abort(22, 1, 99), &[]));
    net.run_to_quiet();
    assert_eq!(resps(&a.drain(&net)), [(22, 0, NOT_ABORTED)]);
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    net.engine.audit().expect("books balance");
}

#[test]
fn a_namespace_change_completes_a_held_async_event_request() {
    let mut net = nvme_net("auto", 64);
    let (mut a, _q) = io_queue(&mut net);
    let mut s = Sqe::new(admin::SET_FEATURES, 5);
    s.set_cdw(10, 0x0B);
    s.set_cdw(11, 1 << 8); // namespace attribute notices
    assert_eq!(a.command(&mut net, s, &[]), 0);
    a.send(
        &mut net,
        Pdu::CapsuleCmd(Sqe::new(admin::ASYNC_EVENT, 6), &[]),
    );
    net.run_to_quiet();
    assert!(a.drain(&net).is_empty(), "held");
    // The change comes from outside any queue (another thread's): the
    // engine takes it from the target's mail at its next tick.
    let t = net.engine.io.catalog().nvme.clone().expect("a target");
    t.with(|t| t.namespace_changed(0, 1));
    net.advance(1_000);
    net.run_to_quiet();
    assert_eq!(resps(&a.drain(&net)), [(6, 0, 0x0004_0002)]);
}

#[test]
fn waiting_commands_of_a_closed_queue_are_let_go_oldest_first() {
    let mut net = nvme_net("auto", 64);
    let (_a, mut q) = io_queue(&mut net);
    for cid in [9, 3, 7] {
        let at = u64::from(cid) * 8192;
        q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, cid, at, 8192), &[]));
    }
    net.run_to_quiet();
    assert_eq!(q.drain(&net).len(), 3, "three R2Ts");
    let order = super::nvme_data::requests_of(q.conn, &mut net.engine.conns);
    let cids: Vec<u64> = order
        .iter()
        .map(|r| net.engine.slots[*r].cookie())
        .collect();
    assert_eq!(cids, [9, 3, 7], "in arrival order");
    net.clients.get_mut(&q.conn).expect("client").eof = true;
    net.run_to_quiet();
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
}
