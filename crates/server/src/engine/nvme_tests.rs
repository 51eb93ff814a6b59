//! The NVMe/TCP front end driven through the engine, sans-IO: a host built
//! from the codec, the fake network and device of `fake.rs`.

use std::sync::Arc;

use pace::pacer::Pacer;
use pool::{PoolConfig, SharedPool};
use proto::nvme::cmd::{admin, fctype, io, sgl, Sgl, Sqe};
use proto::nvme::ctrl::Connect;
use proto::nvme::decode::{Decoded, Decoder, Role};
use proto::nvme::pdu::{DataHdr, Digests, Framing, IcReq, Pdu};

use super::fake::{Net, BUF_SIZE, TIMEOUTS};
use super::nvme_conn::{QID_IN_USE, QID_RECHECK, QID_WAIT};
use super::*;

const NQN: &str = "nqn.2026-11.io.iopace:default";

/// An engine serving NVMe/TCP (and NBD) over `buffers` buffers of 4 KiB,
/// one 1 MiB malloc export, pacing `mode`.
pub(super) fn nvme_net(mode: &str, buffers: u32) -> Net {
    nvme_net_with(mode, buffers, "")
}

/// As [`nvme_net`], with `export` lines added to the export.
fn nvme_net_with(mode: &str, buffers: u32, export: &str) -> Net {
    nvme_net_conf(mode, buffers, export, "")
}

/// As [`nvme_net_with`], with `pacing` lines added to `[pacing]`.
pub(super) fn nvme_net_conf(mode: &str, buffers: u32, export: &str, pacing: &str) -> Net {
    let pool = PoolConfig::large_only(buffers, BUF_SIZE, 2);
    let text = format!(
        "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"1M\"\n\n\
         [[export]]\nname = \"default\"\nbdev = \"m0\"\n{export}\n\
         [buffers]\nnum_shared_buffers = {buffers}\nbuffer_size = \"4096\"\nbuf_cache_size = 2\n\n\
         [pacing]\nmode = \"{mode}\"\n{pacing}"
    );
    let loaded = config::Config::parse(&text, "test.toml").expect("test config");
    let mut catalog = Catalog::build(&loaded).expect("catalog");
    let bytes = u64::from(buffers) * u64::from(BUF_SIZE);
    catalog.nvme = Some(crate::nvmf::target(&[], &loaded, &catalog, bytes));
    let catalog = Arc::new(catalog);
    let pool = SharedPool::new(pool).expect("pool");
    let bufs = pool.register_reactor(Box::new(|| {}));
    let pacer = Pacer::new(catalog.pacing.clone(), 1, BUF_SIZE, None, 0);
    let settings = EngineSettings {
        id: 0,
        max_requests: 16,
        drain_timeout: 1_000_000_000,
        timeouts: TIMEOUTS,
        payload_cap: 2,
    };
    Net::new(Engine::new(settings, catalog, bufs, pacer, 0))
}

/// One host queue over the fake network.
pub(super) struct Host {
    pub(super) conn: ConnId,
    dec: Decoder,
    /// Bytes of `from_server` already decoded.
    seen: usize,
}

impl Host {
    pub(super) fn open(net: &mut Net) -> Host {
        let conn = net.engine.open(net.now, Opening::Nvme).expect("open");
        net.clients.insert(conn, super::fake::Client::default());
        net.pump();
        let mut h = Host {
            conn,
            dec: Decoder::new(Role::Host, 1 << 20),
            seen: 0,
        };
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        };
        h.send(net, Pdu::IcReq(ic));
        net.run_to_quiet();
        assert_eq!(h.recv(net).map(|p| p.0), Some(1), "ICResp");
        h.dec.digests = Some(Digests::default());
        h
    }

    pub(super) fn send(&self, net: &mut Net, p: Pdu<'_>) {
        let mut b = Vec::new();
        p.encode(&mut b, Framing::default());
        net.write(self.conn, &b);
    }

    /// The next whole PDU the engine sent: (type, bytes).
    pub(super) fn recv(&mut self, net: &Net) -> Option<(u8, Vec<u8>)> {
        let all = &net.clients[&self.conn].from_server[self.seen..];
        match self.dec.decode(all) {
            Ok(Decoded::Pdu { pdu, len, .. }) => {
                let t = pdu.type_code();
                let b = all[..len].to_vec();
                self.seen += len;
                Some((t, b))
            }
            _ => None,
        }
    }

    /// Every PDU sent so far.
    pub(super) fn drain(&mut self, net: &Net) -> Vec<(u8, Vec<u8>)> {
        std::iter::from_fn(|| self.recv(net)).collect()
    }

    /// Sends a command and runs the engine; the completion's status.
    pub(super) fn command(&mut self, net: &mut Net, sqe: Sqe, data: &[u8]) -> u16 {
        self.send(net, Pdu::CapsuleCmd(sqe, data));
        net.run_to_quiet();
        let got = self.drain(net);
        let (_, b) = got.iter().find(|(t, _)| *t == 5).expect("a completion");
        (u16::from_le_bytes([b[22], b[23]]) >> 1) & 0x7FF
    }
}

pub(super) fn connect_cmd(qid: u16, cntlid: u16) -> (Sqe, Vec<u8>) {
    let c = Connect {
        qid,
        sqsize: 31,
        kato_ms: 0,
        hostid: [0; 16],
        cntlid,
        subnqn: NQN,
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:engine-test",
    };
    (c.sqe(1), c.data())
}

/// An enabled controller's IO queue.
pub(super) fn io_queue(net: &mut Net) -> (Host, Host) {
    let mut a = Host::open(net);
    let (s, d) = connect_cmd(0, 0xFFFF);
    assert_eq!(a.command(net, s, &d), 0, "admin connect");
    let cntlid = 1;
    let mut p = Sqe::new(admin::FABRICS, 2);
    p.0[4] = fctype::PROPERTY_SET;
    p.set_cdw(11, 0x14);
    p.set_cdw(12, 0x0046_0001);
    assert_eq!(a.command(net, p, &[]), 0, "CC.EN");
    let mut q = Host::open(net);
    let (s, d) = connect_cmd(1, cntlid);
    assert_eq!(q.command(net, s, &d), 0, "io connect");
    (a, q)
}

/// A READ or WRITE of `len` bytes at byte `at` (512-byte blocks), its data
/// by R2T or to the host.
pub(super) fn rw(op: u8, cid: u16, at: u64, len: u32) -> Sqe {
    let mut c = Sqe::new(op, cid);
    c.set_nsid(1);
    c.set_cdw(10, (at / 512) as u32);
    c.set_cdw(12, len / 512 - 1);
    c.set_sgl(Sgl {
        address: 0,
        length: len,
        id: sgl::TRANSPORT_DATA_BLOCK,
    });
    c
}

pub(super) fn r2t_of(b: &[u8]) -> (u16, u16, u32) {
    let cid = u16::from_le_bytes([b[8], b[9]]);
    let ttag = u16::from_le_bytes([b[10], b[11]]);
    let len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    (cid, ttag, len)
}

pub(super) fn h2c(cid: u16, ttag: u16, data: &[u8]) -> Pdu<'_> {
    let h = DataHdr {
        cccid: cid,
        ttag,
        datao: 0,
        last: true,
        success: false,
    };
    Pdu::H2CData(h, data)
}

#[test]
fn a_write_by_r2t_then_its_read_round_trip_through_the_pool() {
    let mut net = nvme_net("auto", 64);
    let (_a, mut q) = io_queue(&mut net);
    q.send(
        &mut net,
        Pdu::CapsuleCmd(rw(io::WRITE, 7, 8192, 16384), &[]),
    );
    net.run_to_quiet();
    let got = q.drain(&net);
    assert_eq!(got.len(), 1, "one R2T");
    assert_eq!(got[0].0, 9);
    let (cid, ttag, len) = r2t_of(&got[0].1);
    assert_eq!((cid, len), (7, 16384));
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 + 3) as u8).collect();
    q.send(&mut net, h2c(cid, ttag, &data));
    net.run_to_quiet();
    assert_eq!(q.drain(&net).iter().map(|p| p.0).collect::<Vec<_>>(), [5]);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 8, 8192, 16384), &[]));
    net.run_to_quiet();
    let got = q.drain(&net);
    // One C2HData flagged LAST and SUCCESS: no CapsuleResp follows.
    assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), [7]);
    assert_eq!(got[0].1[1] & 0x0C, 0x0C, "LAST_PDU and SUCCESS");
    assert_eq!(
        &got[0].1[24..],
        &data[..],
        "C2HData carries what was written"
    );
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    let served = net.engine.snapshot(net.now);
    assert_eq!(served.io["read"].ios + served.io["write"].ios, 2);
}

#[test]
fn a_write_waits_for_buffers_in_the_engine_before_its_r2t() {
    // 16 buffers: a connection commits at most 4 (a quarter), so the
    // second 16 KiB WRITE waits, with no R2T, until the first is done.
    let mut net = nvme_net("buffers", 16);
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 1, 0, 16384), &[]));
    q.send(
        &mut net,
        Pdu::CapsuleCmd(rw(io::WRITE, 2, 16384, 16384), &[]),
    );
    net.run_to_quiet();
    let got = q.drain(&net);
    assert_eq!(got.len(), 1, "only the first WRITE's R2T: {got:?}");
    let (cid, ttag, _) = r2t_of(&got[0].1);
    assert_eq!(cid, 1);
    assert_eq!(
        net.engine.buffers_in_use(),
        4,
        "its buffers, none for the second"
    );
    q.send(&mut net, h2c(cid, ttag, &[0xAB; 16384]));
    net.run_to_quiet();
    let got = q.drain(&net);
    let types: Vec<u8> = got.iter().map(|p| p.0).collect();
    assert_eq!(
        types,
        [5, 9],
        "the first's completion, then the second's R2T"
    );
    assert_eq!(r2t_of(&got[1].1).0, 2);
}

#[test]
fn a_host_gone_mid_write_leaves_nothing_held() {
    let mut net = nvme_net("auto", 64);
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 3, 0, 16384), &[]));
    net.run_to_quiet();
    let got = q.drain(&net);
    let (cid, ttag, _) = r2t_of(&got[0].1);
    // Half the data, then the host closes.
    let mut b = Vec::new();
    h2c(cid, ttag, &[1; 16384]).encode(&mut b, Framing::default());
    b.truncate(b.len() / 2);
    net.write(q.conn, &b);
    net.clients.get_mut(&q.conn).expect("client").eof = true;
    net.run_to_quiet();
    assert!(net.clients[&q.conn].closed, "closed");
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    assert_eq!(net.engine.conns_open(), 1, "the admin queue stays");
}

/// The CapsuleResps among PDUs: (cid, status with SCT, dword 0).
pub(super) fn resps(got: &[(u8, Vec<u8>)]) -> Vec<(u16, u16, u32)> {
    let mut r: Vec<_> = got
        .iter()
        .filter(|(t, _)| *t == 5)
        .map(|(_, b)| {
            let cid = u16::from_le_bytes([b[20], b[21]]);
            let status = (u16::from_le_bytes([b[22], b[23]]) >> 1) & 0x7FF;
            (cid, status, u32::from_le_bytes([b[8], b[9], b[10], b[11]]))
        })
        .collect();
    r.sort_unstable();
    r
}

#[test]
fn an_abort_completes_a_held_async_event_request_and_a_reset_lets_go() {
    let mut net = nvme_net("auto", 64);
    let (mut a, _q) = io_queue(&mut net);
    for cid in 10..12 {
        a.send(
            &mut net,
            Pdu::CapsuleCmd(Sqe::new(admin::ASYNC_EVENT, cid), &[]),
        );
    }
    net.run_to_quiet();
    assert!(a.drain(&net).is_empty(), "AERs are held");
    // Abort AER 10 (SQID 0): it completes as Command Abort Requested, and
    // the Abort says it was aborted (dword 0 bit 0 clear).
    let mut ab = Sqe::new(admin::ABORT, 20);
    ab.set_cdw(10, 10 << 16);
    a.send(&mut net, Pdu::CapsuleCmd(ab, &[]));
    net.run_to_quiet();
    assert_eq!(resps(&a.drain(&net)), [(10, 0x007, 0), (20, 0, 0)]);
    // A reset: AER 11 is let go with no completion, and a new one holds.
    let mut p = Sqe::new(admin::FABRICS, 21);
    p.0[4] = fctype::PROPERTY_SET;
    p.set_cdw(11, 0x14);
    a.send(&mut net, Pdu::CapsuleCmd(p, &[]));
    net.run_to_quiet();
    assert_eq!(resps(&a.drain(&net)), [(21, 0, 0)]);
    let mut p = Sqe::new(admin::FABRICS, 22);
    p.0[4] = fctype::PROPERTY_SET;
    p.set_cdw(11, 0x14);
    p.set_cdw(12, 0x0046_0001);
    a.send(&mut net, Pdu::CapsuleCmd(p, &[]));
    for cid in [11, 23, 24, 25] {
        a.send(
            &mut net,
            Pdu::CapsuleCmd(Sqe::new(admin::ASYNC_EVENT, cid), &[]),
        );
    }
    net.run_to_quiet();
    assert_eq!(
        resps(&a.drain(&net)),
        [(22, 0, 0)],
        "CC.EN, then 4 AERs held"
    );
}

#[test]
fn nvme_writes_and_write_zeroes_mark_the_exports_dirty_bitmap() {
    let bitmap = "dirty_bitmaps = [\"backup\"]\ndirty_granularity = \"4K\"\n";
    let mut net = nvme_net_with("auto", 64, bitmap);
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 7, 8192, 8192), &[]));
    net.run_to_quiet();
    let got = q.drain(&net);
    let (cid, ttag, _) = r2t_of(&got[0].1);
    q.send(&mut net, h2c(cid, ttag, &[9u8; 8192]));
    net.run_to_quiet();
    q.drain(&net);
    let mut z = Sqe::new(io::WRITE_ZEROES, 8);
    z.set_nsid(1);
    z.set_cdw(10, (65536 / 512) as u32);
    z.set_cdw(12, 1); // two 512-byte blocks
    assert_eq!(q.command(&mut net, z, &[]), 0, "write zeroes");
    let b = net.engine.io.catalog().exports[0]
        .dirty
        .get("backup")
        .expect("kept");
    let k = 1024;
    let want = [
        (8 * k, 0),
        (8 * k, 1),
        (48 * k, 0),
        (4 * k, 1),
        (956 * k, 0),
    ];
    assert_eq!(b.extents(0, 1 << 20), want);
}

#[test]
fn an_r2t_waits_for_the_end_of_a_read_reply_a_short_send_cut() {
    // A READ's C2HData is on its way out when a WRITE's R2T is written: the
    // send comes back short, inside the C2HData's data. The R2T must go
    // after the rest of that PDU, not into the middle of it.
    let mut net = nvme_net("auto", 64);
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 8, 0, 16384), &[]));
    net.deliver(q.conn, usize::MAX);
    while !net.ios.is_empty() {
        net.complete_io(0);
    }
    q.send(
        &mut net,
        Pdu::CapsuleCmd(rw(io::WRITE, 9, 65536, 8192), &[]),
    );
    net.deliver(q.conn, usize::MAX);
    net.advance(1_000);
    assert!(net.take_sent(q.conn, 100), "the READ's reply was posted");
    net.run_to_quiet();
    let got = q.drain(&net);
    let types: Vec<u8> = got.iter().map(|p| p.0).collect();
    assert_eq!(types, [7, 9], "the whole C2HData, then the R2T");
    assert_eq!(got[0].1.len(), 24 + 16384);
}

#[test]
fn a_qid_reused_before_its_old_queue_closed_is_checked_again() {
    // A host drops I/O queue 1 and connects a new one with the same QID;
    // the new Connect comes before the old queue's close (on another
    // reactor, in a real target). It waits for that close.
    let mut net = nvme_net("auto", 64);
    let (_a, old) = io_queue(&mut net);
    let mut again = Host::open(&mut net);
    let (s, d) = connect_cmd(1, 1);
    again.send(&mut net, Pdu::CapsuleCmd(s, &d));
    net.run_to_quiet();
    assert!(again.drain(&net).is_empty(), "no answer yet");
    net.clients.get_mut(&old.conn).expect("client").eof = true;
    net.run_to_quiet();
    net.advance(QID_RECHECK);
    net.run_to_quiet();
    assert_eq!(resps(&again.drain(&net)), [(1, 0, 1)], "connected");
    // A QID that stays in use is refused once the wait is over.
    let mut third = Host::open(&mut net);
    third.send(&mut net, Pdu::CapsuleCmd(s, &d));
    net.run_to_quiet();
    net.advance(QID_WAIT / 2);
    net.run_to_quiet();
    assert!(third.drain(&net).is_empty(), "still waiting");
    net.advance(QID_WAIT / 2);
    net.run_to_quiet();
    let refused = (1, 0x182, QID_IN_USE);
    assert_eq!(
        resps(&third.drain(&net)),
        [refused],
        "Connect Invalid Parameters, QID"
    );
    assert_eq!(
        net.engine.conns_open(),
        3,
        "the admin queue and two I/O queues"
    );
}

#[test]
fn a_host_that_stops_mid_h2cdata_times_out_with_nothing_held() {
    // The queue takes an H2CData PDU's data as it comes: nothing stays
    // buffered, but the host still owes the rest; the payload timeout
    // applies as to any PDU cut short.
    let mut net = nvme_net("auto", 64);
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 3, 0, 16384), &[]));
    net.run_to_quiet();
    let (cid, ttag, _) = r2t_of(&q.drain(&net)[0].1);
    let mut b = Vec::new();
    h2c(cid, ttag, &[1; 16384]).encode(&mut b, Framing::default());
    b.truncate(b.len() / 2);
    net.write(q.conn, &b);
    net.run_to_quiet();
    assert!(!net.clients[&q.conn].closed, "waits for the rest");
    net.advance(TIMEOUTS.payload + 1);
    net.run_to_quiet();
    assert!(net.clients[&q.conn].closed, "timed out");
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
}

/// An IO queue whose WRITE 7 of 64 KiB at 0 has its R2T out and its
/// H2CData header received: the engine's next recv goes straight into the
/// WRITE's buffers. The host queue and the PDU's data still to send.
fn h2c_header_in(net: &mut Net) -> (Host, Vec<u8>) {
    net.after_event = Some(|n: &Net| n.engine.audit().expect("books balance"));
    let (_a, mut q) = io_queue(net);
    q.send(net, Pdu::CapsuleCmd(rw(io::WRITE, 7, 0, 65536), &[]));
    net.run_to_quiet();
    let (cid, ttag, len) = r2t_of(&q.drain(net)[0].1);
    assert_eq!((cid, len), (7, 65536));
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 5) as u8).collect();
    let mut b = Vec::new();
    h2c(cid, ttag, &data).encode(&mut b, Framing::default());
    let head = b.len() - data.len();
    net.write(q.conn, &b[..head]);
    assert!(net.deliver(q.conn, head));
    let (_, recv, _, _) = net.engine.conn_state(q.conn).expect("open");
    assert_eq!(
        recv,
        RecvOp::H2c(ReqId(0)),
        "the next recv lands in the WRITE"
    );
    (q, data)
}

#[test]
fn h2cdata_lands_straight_in_the_write_buffers() {
    let mut net = nvme_net("auto", 64);
    let (mut q, data) = h2c_header_in(&mut net);
    net.write(q.conn, &data);
    // 4 KiB buffers: one recv each while 16 KiB or more are due, the
    // rest through the receive buffer.
    let mut direct = 0;
    loop {
        let (_, recv, _, _) = net.engine.conn_state(q.conn).expect("open");
        direct += u32::from(matches!(recv, RecvOp::H2c(_)));
        if !net.deliver(q.conn, usize::MAX) {
            break;
        }
    }
    assert_eq!(direct, 13, "(64 - 16) / 4 + 1 recvs into the buffers");
    net.run_to_quiet();
    assert_eq!(resps(&q.drain(&net)), [(7, 0, 0)], "written");
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 8, 0, 65536), &[]));
    net.run_to_quiet();
    let got = q.drain(&net);
    assert_eq!(&got[0].1[24..], &data[..], "what landed is what is read");
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0, "the pool is full");
}

#[test]
fn a_write_whose_h2cdata_is_landing_lets_go_at_a_close_or_a_drain() {
    // Timed out mid-data: the close waits for the recv into the buffers.
    let mut net = nvme_net("auto", 64);
    let (q, _) = h2c_header_in(&mut net);
    net.advance(TIMEOUTS.payload + 1);
    net.run_to_quiet();
    assert!(net.clients[&q.conn].closed, "timed out");
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    // Drained mid-data: its input ends while the recv is out.
    let mut net = nvme_net("auto", 64);
    let (q, data) = h2c_header_in(&mut net);
    net.write(q.conn, &data[..4096]);
    net.engine.begin_drain(net.now);
    net.pump();
    net.run_to_quiet();
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
    // The host closes mid-data.
    let mut net = nvme_net("auto", 64);
    let (q, data) = h2c_header_in(&mut net);
    net.write(q.conn, &data[..8192]);
    net.clients.get_mut(&q.conn).expect("client").eof = true;
    net.run_to_quiet();
    assert!(net.clients[&q.conn].closed, "closed");
    assert_eq!(net.engine.requests_in_use(), 0);
    assert_eq!(net.engine.buffers_in_use(), 0);
}

#[test]
fn an_h2cdata_pdu_sent_whole_lands_mostly_straight_in_the_buffers() {
    // The host sends header and data at once: the receive buffer takes
    // the header and the first bytes (`H2C_HEAD_RECV`), the rest lands in
    // the WRITE's buffers while 16 KiB or more are due.
    let mut net = nvme_net("auto", 64);
    net.after_event = Some(|n: &Net| n.engine.audit().expect("books balance"));
    let (_a, mut q) = io_queue(&mut net);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::WRITE, 7, 0, 65536), &[]));
    net.run_to_quiet();
    let (cid, ttag, _) = r2t_of(&q.drain(&net)[0].1);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 3 + 1) as u8).collect();
    let before = net.engine.snapshot(net.now).bytes_in_direct;
    q.send(&mut net, h2c(cid, ttag, &data));
    net.run_to_quiet();
    assert_eq!(resps(&q.drain(&net)), [(7, 0, 0)], "written");
    let direct = net.engine.snapshot(net.now).bytes_in_direct - before;
    // 4 KiB less the 24-byte header went through the receive buffer with
    // it; then 4 KiB buffers one recv each down to 16 KiB due.
    assert_eq!(direct, 65536 - (4096 - 24) - 12288);
    q.send(&mut net, Pdu::CapsuleCmd(rw(io::READ, 8, 0, 65536), &[]));
    net.run_to_quiet();
    assert_eq!(&q.drain(&net)[0].1[24..], &data[..]);
    assert_eq!(net.engine.buffers_in_use(), 0, "the pool is full");
}
