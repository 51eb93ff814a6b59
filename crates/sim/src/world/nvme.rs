//! Hosts that speak NVMe/TCP (`protocol = "nvme-tcp"`): per device, a
//! controller of the export's subsystem, set up as a host does (ICReq,
//! admin Connect, CAP, CC.EN, Identify), and one I/O queue on its own
//! connection. Every queue of a host names the host's NQN, so the target's
//! pacer sees one host with a flow per queue. READs come back as C2HData;
//! a WRITE's data goes in its capsule when small, else in H2CData once the
//! target's R2T reaches the host.

use pace::Nanos;
use server::engine::Opening;

use super::{Ev, Sim};
use crate::chunk::NvmeMark;
use crate::hosts::Dial;
use crate::nvme_host::{self as nh, HostQueue, SetupReply};
use crate::socket::Sock;

impl Sim<'_> {
    /// Opens host `dial.host`'s controller for `dial.device` and its I/O
    /// queue, both on `dial.reactor`; returns the I/O queue's socket. The
    /// setup's round trips are not simulated.
    pub(super) fn connect_nvme(&mut self, dial: Dial) -> usize {
        let (r, h) = (dial.reactor, dial.host);
        let tenant = self.hosts[h].tenant;
        let subnqn = self.target.nqn(dial.device, tenant).to_string();
        let admin = self.open_nvme(r, h);
        let setup = |sim: &mut Self, s, bytes, fresh| {
            let replies = sim.exchange(s, bytes, fresh);
            let done = replies
                .as_deref()
                .map_err(|e| e.clone())
                .and_then(nh::completion);
            done.map(|(c, d)| (c.result, d.map(<[u8]>::to_vec)))
                .unwrap_or_else(|e| panic!("{subnqn}: host {h}: NVMe/TCP setup: {e}"))
        };
        let open = nh::open_queue(h, &subnqn, 0, 0xFFFF, nh::ADMIN_QUEUE);
        let cntlid = setup(self, admin, open, true).0 as u16;
        let cap = setup(self, admin, nh::get_cap(2), false).0;
        setup(self, admin, nh::enable(3), false);
        let ctrl = setup(self, admin, nh::identify(4, 1), false).1;
        let ns = setup(self, admin, nh::identify(5, 0), false).1;
        let (ctrl, ns) = (ctrl.unwrap_or_default(), ns.unwrap_or_default());
        // CAP.MQES, 0's based (a queue of 65536 would not fit a u16).
        let entries = (cap & 0xFFFF).min(0xFFFE) as u16 + 1;
        let ioccsz = ctrl
            .get(1792..1796)
            .map_or(4, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let lbaf = 128 + 4 * usize::from(ns.get(26).map_or(0, |f| f & 0xF));
        let shift = ns.get(lbaf + 2).copied().unwrap_or(9);
        let s = self.open_nvme(r, h);
        let open = nh::open_queue(h, &subnqn, 1, cntlid, entries);
        let replies = self.exchange(s, open, true);
        let maxh2cdata = match replies.as_deref() {
            Ok([SetupReply::IcResp { maxh2cdata }, ..]) => *maxh2cdata,
            _ => 0,
        };
        if let Err(e) = replies
            .as_deref()
            .map_err(|e| e.clone())
            .and_then(nh::completion)
        {
            panic!("{subnqn}: host {h}: I/O queue: {e}");
        }
        // IOCCSZ counts the 64-byte command too.
        assert!((4..1 << 20).contains(&ioccsz), "{subnqn}: IOCCSZ {ioccsz}");
        let in_capsule = ioccsz * 16 - 64;
        let q = HostQueue::new(entries, maxh2cdata, in_capsule, shift);
        let sock = &mut self.socks[s];
        sock.nvme = Some(Box::new(q));
        sock.setup_rx = None;
        sock.negotiated = true;
        s
    }

    /// A new NVMe/TCP connection of host `h` on reactor `r`: its socket.
    fn open_nvme(&mut self, r: usize, h: usize) -> usize {
        let Some(conn) = self.target.engines[r].open(self.now, Opening::Nvme) else {
            panic!("reactor {r}: a new engine is not draining");
        };
        let s = self.socks.len();
        let peer = format!("10.{}.{}.1:{}", h / 256, h % 256, 40_000 + s % 20_000);
        self.target.engines[r].set_peer(conn, &peer, Some(self.hosts[h].port));
        let slots = &mut self.sock_of[r];
        if slots.len() <= conn.index as usize {
            slots.resize(conn.index as usize + 1, u32::MAX);
        }
        slots[conn.index as usize] = s as u32;
        let mut sock = Sock::new(r, conn, h);
        sock.setup_rx = Some(Vec::new());
        self.socks.push(sock);
        self.pump(r);
        s
    }

    /// Sends `bytes` on setup socket `s` at once and decodes what the
    /// target answered.
    fn exchange(
        &mut self,
        s: usize,
        bytes: Vec<u8>,
        fresh: bool,
    ) -> Result<Vec<SetupReply>, String> {
        let r = self.socks[s].reactor;
        self.socks[s].setup_rx = Some(Vec::new());
        self.socks[s].send_in(self.now, bytes, 0);
        self.feed(s);
        self.pump(r);
        let got = self.socks[s].setup_rx.take().unwrap_or_default();
        nh::setup_replies(&got, fresh)
    }

    /// IO `id`'s capsule goes on its queue, or waits for a command id.
    pub(super) fn nvme_send(&mut self, id: u32) {
        let io = &self.ios[id as usize];
        let (s, read, bytes, offset) = (io.sock as usize, io.read, io.bytes, io.offset);
        let rtt = self.hosts[io.host].rtt;
        let Some(q) = self.socks[s].nvme.as_deref_mut() else {
            debug_assert!(false, "IO {id}: socket {s} is not an NVMe/TCP I/O queue");
            return;
        };
        let Some(cid) = q.take_cid(id) else {
            q.backlog.push_back(id);
            return;
        };
        let in_capsule = !read && bytes <= q.in_capsule;
        let head = nh::capsule(read, cid, offset, bytes, q.shift, in_capsule);
        self.ios[id as usize].cid = cid;
        let arrive = self.now + rtt / 2;
        let payload = if in_capsule { bytes } else { 0 };
        self.socks[s].send_in(arrive, head, payload);
        self.at(arrive, Ev::Arrive(s as u32));
    }

    /// A PDU's end reached its host at `at`: a completion, or an R2T.
    pub(super) fn nvme_mark(&mut self, s: usize, cid: u16, mark: NvmeMark, at: Nanos) {
        let Some(id) = self.socks[s].nvme.as_deref().and_then(|q| q.io_of(cid)) else {
            self.nvme_wrong(s, format!("a PDU for command {cid}, not in flight"));
            return;
        };
        let io = &self.ios[id as usize];
        match mark {
            NvmeMark::Done { status, data } => {
                let want = if io.read { io.bytes } else { 0 };
                if status != 0 || data != want {
                    let what = format!("command {cid}: status {status:#x}, {data} of {want} bytes");
                    self.nvme_wrong(s, what);
                }
                self.at(at, Ev::Reply(id));
            }
            NvmeMark::R2t { ttag, offset, len } => {
                let end = u64::from(offset) + u64::from(len);
                if io.read || len == 0 || end > u64::from(io.bytes) {
                    let what = format!("command {cid}: R2T for {len} bytes at {offset}");
                    self.nvme_wrong(s, what);
                    return;
                }
                self.at(at, Ev::R2t(s as u32, cid, ttag, offset, len));
            }
        }
    }

    /// An R2T reached the host: the data it asks for goes out as H2CData
    /// PDUs of at most MAXH2CDATA bytes each.
    pub(super) fn nvme_r2t(&mut self, s: usize, cid: u16, ttag: u16, offset: u32, len: u32) {
        let Some(q) = self.socks[s].nvme.as_deref() else {
            return;
        };
        let Some(id) = q.io_of(cid) else {
            return;
        };
        let max = q.maxh2cdata.max(4096);
        let total = self.ios[id as usize].bytes;
        let host = self.socks[s].host;
        let arrive = self.now + self.hosts[host].rtt / 2;
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let n = (end - at).min(max);
            let head = nh::h2c_head(cid, ttag, at, n, at + n == total);
            self.socks[s].send_in(arrive, head, n);
            at += n;
        }
        self.at(arrive, Ev::Arrive(s as u32));
    }

    /// IO `id` (on socket `s`, command `cid`) completed at its host: the
    /// command id is free, and the oldest IO waiting for one goes.
    pub(super) fn nvme_replied(&mut self, s: usize, cid: u16) {
        let Some(q) = self.socks[s].nvme.as_deref_mut() else {
            return;
        };
        q.release(cid);
        if let Some(next) = q.backlog.pop_front() {
            self.nvme_send(next);
        }
    }

    /// The target sent socket `s`'s host something it did not expect.
    fn nvme_wrong(&mut self, s: usize, what: String) {
        debug_assert!(false, "socket {s}: {what}");
        self.nvme_errors.push(format!("socket {s}: {what}"));
    }
}

#[cfg(test)]
impl Sim<'_> {
    /// Hosts stop issuing; the run goes on until every IO issued has its
    /// reply (false: not within 10 simulated seconds).
    pub(crate) fn finish(&mut self) -> bool {
        use std::cmp::Reverse;
        self.quiesce = true;
        let end = self.now + 10_000_000_000;
        while self.completed < self.issued {
            let Some(Reverse((t, _, ev))) = self.events.pop() else {
                return false;
            };
            if t > end {
                return false;
            }
            self.now = t;
            self.handle(ev);
        }
        true
    }

    /// Commands in flight on the NVMe/TCP queues, and IOs waiting for one.
    pub(crate) fn nvme_outstanding(&self) -> (usize, usize) {
        let queues = self.socks.iter().filter_map(|s| s.nvme.as_deref());
        queues.fold((0, 0), |(f, b), q| (f + q.in_flight(), b + q.backlog.len()))
    }
}
