//! Hosts that speak NVMe/TCP (`protocol = "nvme-tcp"`): per device, a
//! controller of the export's subsystem, set up as a host does (ICReq,
//! admin Connect, CAP, CC.EN, Identify), and one I/O queue on its own
//! connection. Every queue of a host names the host's NQN, so the target's
//! pacer sees one host with a flow per queue. READs come back as C2HData;
//! a WRITE's data goes in its capsule when small, else in H2CData once the
//! target's R2T reaches the host.
//!
//! The setup runs over a [`Setup`] (the simulator opens connections and
//! exchanges bytes at once); the IOs' capsules, R2Ts and completions go
//! over the world's sockets and clock ([`HostSide`]).

use pace::Nanos;

use super::clock::Clock;
use super::ios::Ios;
use super::net::Net;
use super::Ev;
use crate::chunk::NvmeMark;
use crate::hosts::Host;
use crate::nvme_host::{self as nh, HostQueue, SetupReply};

/// Connections as a host's setup sees them: its round trips take no time.
pub(super) trait Setup {
    /// A new NVMe/TCP connection of host `h` on reactor `r`: its socket.
    fn open(&mut self, r: usize, h: usize) -> usize;
    /// Sends `bytes` on setup socket `s` and decodes what the target
    /// answered (`fresh`: an ICResp comes first).
    fn exchange(
        &mut self,
        s: usize,
        bytes: Vec<u8>,
        fresh: bool,
    ) -> Result<Vec<SetupReply>, String>;
}

/// Opens host `h`'s controller of `subnqn` and its I/O queue, both on
/// reactor `r`: the I/O queue's socket, and the host's side of it.
pub(super) fn connect(w: &mut impl Setup, r: usize, h: usize, subnqn: &str) -> (usize, HostQueue) {
    let admin = w.open(r, h);
    let mut setup = |bytes, fresh| {
        let replies = w.exchange(admin, bytes, fresh);
        let done = replies
            .as_deref()
            .map_err(|e| e.clone())
            .and_then(nh::completion);
        done.map(|(c, d)| (c.result, d.map(<[u8]>::to_vec)))
            .unwrap_or_else(|e| panic!("{subnqn}: host {h}: NVMe/TCP setup: {e}"))
    };
    let open = nh::open_queue(h, subnqn, 0, 0xFFFF, nh::ADMIN_QUEUE);
    let cntlid = setup(open, true).0 as u16;
    let cap = setup(nh::get_cap(2), false).0;
    setup(nh::enable(3), false);
    let ctrl = setup(nh::identify(4, 1), false).1;
    let ns = setup(nh::identify(5, 0), false).1;
    let (ctrl, ns) = (ctrl.unwrap_or_default(), ns.unwrap_or_default());
    // CAP.MQES, 0's based (a queue of 65536 would not fit a u16).
    let entries = (cap & 0xFFFF).min(0xFFFE) as u16 + 1;
    let ioccsz = ctrl
        .get(1792..1796)
        .map_or(4, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let lbaf = 128 + 4 * usize::from(ns.get(26).map_or(0, |f| f & 0xF));
    let shift = ns.get(lbaf + 2).copied().unwrap_or(9);
    let s = w.open(r, h);
    let open = nh::open_queue(h, subnqn, 1, cntlid, entries);
    let replies = w.exchange(s, open, true);
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
    (s, HostQueue::new(entries, maxh2cdata, in_capsule, shift))
}

/// What an NVMe/TCP host's I/O queue acts on: the sockets (each holds
/// its host's side of the queue), the IOs, the hosts' RTTs, the clock.
pub(super) struct HostSide<'w> {
    pub net: &'w mut Net,
    pub ios: &'w mut Ios,
    pub hosts: &'w [Host],
    pub clock: &'w mut Clock,
}

impl HostSide<'_> {
    /// IO `id`'s capsule goes on its queue, or waits for a command id.
    pub fn send(&mut self, id: u32) {
        let io = self.ios.get(id);
        let (s, read, bytes, offset) = (io.sock as usize, io.read, io.bytes, io.offset);
        let rtt = self.hosts[io.host].rtt;
        let Some(q) = self.net.sock_mut(s).nvme.as_deref_mut() else {
            debug_assert!(false, "IO {id}: socket {s} is not an NVMe/TCP I/O queue");
            return;
        };
        let Some(cid) = q.take_cid(id) else {
            q.backlog.push_back(id);
            return;
        };
        let in_capsule = !read && bytes <= q.in_capsule;
        let head = nh::capsule(read, cid, offset, bytes, q.shift, in_capsule);
        self.ios.set_cid(id, cid);
        let arrive = self.clock.now() + rtt / 2;
        let payload = if in_capsule { bytes } else { 0 };
        self.net.sock_mut(s).send_in(arrive, head, payload);
        self.clock.at(arrive, Ev::Arrive(s as u32));
    }

    /// A PDU's end reached socket `s`'s host at `at`: a completion, or an
    /// R2T. Err: what the target sent that the host did not expect.
    pub fn mark(&mut self, s: usize, cid: u16, mark: NvmeMark, at: Nanos) -> Result<(), String> {
        let Some(id) = self.net.sock(s).nvme.as_deref().and_then(|q| q.io_of(cid)) else {
            return Err(format!("a PDU for command {cid}, not in flight"));
        };
        let io = self.ios.get(id);
        match mark {
            NvmeMark::Done { status, data } => {
                let want = if io.read { io.bytes } else { 0 };
                self.clock.at(at, Ev::Reply(id));
                if status != 0 || data != want {
                    return Err(format!(
                        "command {cid}: status {status:#x}, {data} of {want} bytes"
                    ));
                }
            }
            NvmeMark::R2t { ttag, offset, len } => {
                let end = u64::from(offset) + u64::from(len);
                if io.read || len == 0 || end > u64::from(io.bytes) {
                    return Err(format!("command {cid}: R2T for {len} bytes at {offset}"));
                }
                self.clock.at(at, Ev::R2t(s as u32, cid, ttag, offset, len));
            }
        }
        Ok(())
    }

    /// An R2T reached socket `s`'s host: the data it asks for goes out as
    /// H2CData PDUs of at most MAXH2CDATA bytes each.
    pub fn r2t(&mut self, s: usize, cid: u16, ttag: u16, offset: u32, len: u32) {
        let Some(q) = self.net.sock(s).nvme.as_deref() else {
            return;
        };
        let Some(id) = q.io_of(cid) else {
            return;
        };
        let max = q.maxh2cdata.max(4096);
        let total = self.ios.get(id).bytes;
        let host = self.net.sock(s).host;
        let arrive = self.clock.now() + self.hosts[host].rtt / 2;
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let n = (end - at).min(max);
            let head = nh::h2c_head(cid, ttag, at, n, at + n == total);
            self.net.sock_mut(s).send_in(arrive, head, n);
            at += n;
        }
        self.clock.at(arrive, Ev::Arrive(s as u32));
    }

    /// Command `cid` on socket `s` completed at its host: the command id
    /// is free, and the oldest IO waiting for one goes.
    pub fn replied(&mut self, s: usize, cid: u16) {
        let Some(q) = self.net.sock_mut(s).nvme.as_deref_mut() else {
            return;
        };
        q.release(cid);
        if let Some(next) = q.backlog.pop_front() {
            self.send(next);
        }
    }
}
