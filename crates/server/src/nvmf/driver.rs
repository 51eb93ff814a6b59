//! The NVMe/TCP thread's loop: poll(2) over its listeners and connections,
//! each connection's queue fed bytes and its actions carried out. Connect
//! and admin commands go to the one `Target`; data commands wait in a pacer
//! (the same pacing config and cost models as the reactors') until their
//! buffers are admitted, and only then does a WRITE's R2T go out; IO runs
//! on the export's bdev (`device.rs`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pace::pacer::{IoKind, PacedIo, Pacer};
use pace::Nanos;
use proto::nvme::ctrl::{AdminDone, Target};
use proto::nvme::queue::{Action, DevOp};
use proto::nvme::Status;
use proto::Access;

use super::conn::{Conn, Rx, OUT_HIGH_WATER};
use super::device::DeviceRunner;
use crate::access::Client;
use crate::config::PollMode;
use crate::exports::Catalog;

/// Longest sleep, so a stop request is seen.
const MAX_WAIT_NS: Nanos = 100_000_000;
/// Most bytes of data commands one connection may have admitted (their
/// data in memory, or its R2T out) before the next waits on the connection:
/// with pacing `none` or `buffers` the pacer admits at once, and a queue
/// of 128 commands of 1 MiB would otherwise hold 128 MiB.
const CONN_ADMITTED_CAP: u64 = 8 << 20;

/// Connection timeouts (ns): to send ICReq, and for a PDU half sent; and
/// how the thread waits (`[server] poll`, `poll_spin_us`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub handshake: Nanos,
    pub stalled_pdu: Nanos,
    pub poll: PollMode,
    pub spin: Nanos,
}

/// A device completion held for an emulated delay.
type Held = (Nanos, u64, u16, u64);

pub(crate) struct Driver {
    pub listeners: Vec<TcpListener>,
    pub conns: HashMap<u64, Conn>,
    next_conn: u64,
    pub target: Target,
    pacer: Pacer,
    pacing: super::PacingMailbox,
    dev: DeviceRunner,
    catalog: Arc<Catalog>,
    /// Pacer id -> (connection, command id, bytes).
    paced: HashMap<u64, (u64, u16, u32)>,
    next_io: u64,
    held: BinaryHeap<Reverse<Held>>,
    held_results: HashMap<u64, Result<Vec<u8>, Status>>,
    origin: Instant,
    timeouts: Timeouts,
    /// When bytes last arrived (for `adaptive` polling).
    last_rx: Nanos,
}

/// What the driver is built from.
pub(crate) struct Parts {
    pub target: Target,
    pub pacer: Pacer,
    pub pacing: super::PacingMailbox,
    pub catalog: Arc<Catalog>,
    pub origin: Instant,
    pub timeouts: Timeouts,
}

impl Driver {
    pub(crate) fn new(listeners: Vec<TcpListener>, p: Parts) -> std::io::Result<Driver> {
        Ok(Driver {
            listeners,
            conns: HashMap::new(),
            next_conn: 1,
            target: p.target,
            pacer: p.pacer,
            pacing: p.pacing,
            dev: DeviceRunner::new()?,
            catalog: p.catalog,
            paced: HashMap::new(),
            next_io: 1,
            held: BinaryHeap::new(),
            held_results: HashMap::new(),
            origin: p.origin,
            timeouts: p.timeouts,
            last_rx: 0,
        })
    }

    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// Runs until `stop`; then closes every connection.
    pub(crate) fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.turn();
        }
        let keys: Vec<u64> = self.conns.keys().copied().collect();
        for k in keys {
            self.close(k);
        }
    }

    /// One loop turn: wait for sockets or the next deadline, then serve.
    fn turn(&mut self) {
        let (mut fds, keys) = self.poll_set();
        let now = self.now();
        let t = self.timeouts;
        let spinning = match t.poll {
            PollMode::Busy => true,
            PollMode::Adaptive => now.saturating_sub(self.last_rx) < t.spin,
            PollMode::Interrupt => false,
        };
        let wait = if spinning {
            0
        } else {
            self.next_deadline(now).saturating_sub(now).min(MAX_WAIT_NS)
        };
        let ts = libc::timespec {
            tv_sec: (wait / 1_000_000_000) as libc::time_t,
            tv_nsec: (wait % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `fds` is a valid array of pollfd for its length; `ts` lives
        // across the call; no signal mask is passed.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n > 0 {
            let nl = self.listeners.len();
            for (i, fd) in fds.iter().enumerate() {
                if fd.revents == 0 {
                    continue;
                }
                if i < nl {
                    self.accept(i);
                } else {
                    self.serve(keys[i - nl], fd.revents);
                }
            }
        }
        self.timers();
    }

    fn poll_set(&self) -> (Vec<libc::pollfd>, Vec<u64>) {
        let mut fds: Vec<libc::pollfd> = self
            .listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let mut keys = Vec::with_capacity(self.conns.len());
        for (&k, c) in &self.conns {
            let mut events = 0;
            if !c.queue.closing() && c.pending_output() < OUT_HIGH_WATER {
                events |= libc::POLLIN;
            }
            if c.pending_output() > 0 {
                events |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: c.sock.as_raw_fd(),
                events,
                revents: 0,
            });
            keys.push(k);
        }
        (fds, keys)
    }

    fn next_deadline(&self, now: Nanos) -> Nanos {
        let mut d = now + MAX_WAIT_NS;
        if let Some(Reverse(h)) = self.held.peek() {
            d = d.min(h.0);
        }
        if let Some(t) = self.pacer.next_wakeup(now) {
            d = d.min(t);
        }
        if let Some(t) = self.target.next_deadline() {
            d = d.min(t);
        }
        d
    }

    fn accept(&mut self, i: usize) {
        let Ok((sock, peer)) = self.listeners[i].accept() else {
            return;
        };
        if sock.set_nonblocking(true).is_err() {
            return;
        }
        let _ = sock.set_nodelay(true);
        let k = self.next_conn;
        self.next_conn += 1;
        tracing::info!(%peer, conn = k, "nvme/tcp: accepted a connection");
        let now = self.now();
        let c = Conn::new(sock, peer, self.target.limits, k, now);
        self.conns.insert(k, c);
    }

    /// Socket events on connection `k`.
    fn serve(&mut self, k: u64, revents: libc::c_short) {
        let now = self.now();
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        if revents & libc::POLLIN != 0 || revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            match c.receive(now) {
                Rx::Gone => return self.close(k),
                Rx::Data => self.last_rx = now,
                Rx::Idle => {}
            }
        }
        self.drive(k);
    }

    /// Carries out connection `k`'s actions until none is left, then sends.
    fn drive(&mut self, k: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&k) else {
                return;
            };
            let actions = c.queue.take_actions();
            if actions.is_empty() {
                break;
            }
            for a in actions {
                self.act(k, a);
            }
        }
        self.settle(k);
    }

    /// After a connection's commands moved: output to the send buffer,
    /// finished commands' pacer ids to wait for their bytes, and send.
    fn settle(&mut self, k: u64) {
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        c.collect_output();
        let done: Vec<u16> = c
            .paced
            .keys()
            .copied()
            .filter(|cid| !c.queue.has(*cid))
            .collect();
        for cid in done {
            if let Some(id) = c.paced.remove(&cid) {
                c.leaving.push_back((c.queued, id));
            }
        }
        if !c.send() {
            return self.close(k);
        }
        let now = self.origin.elapsed().as_nanos() as Nanos;
        for id in c.left() {
            if let Some((_, _, len)) = self.paced.remove(&id) {
                c.admitted -= u64::from(len);
            }
            self.pacer.on_complete(id, now);
        }
        if c.queue.closing() && c.pending_output() == 0 {
            return self.close(k);
        }
        self.admit_waiting(k, now);
    }

    /// Data commands held back by the connection's cap go to the pacer as
    /// the connection's admitted bytes leave.
    fn admit_waiting(&mut self, k: u64, now: Nanos) {
        while let Some(c) = self.conns.get_mut(&k) {
            let Some(&(cid, len, write)) = c.waiting.front() else {
                return;
            };
            if c.admitted > 0 && c.admitted + u64::from(len) > CONN_ADMITTED_CAP {
                return;
            }
            c.waiting.pop_front();
            self.enqueue(k, cid, len, write, now);
        }
    }

    fn act(&mut self, k: u64, a: Action) {
        let now = self.now();
        match a {
            Action::Connect { cid, sqe, data } => self.connect(k, cid, &sqe, &data, now),
            Action::Admin { cid, cntlid, sqe } => {
                let d = self.target.admin(cntlid, &sqe, now);
                if let Some(c) = self.conns.get_mut(&k) {
                    c.queue.admin_done(cid, d);
                }
            }
            Action::Admit { cid, len, write } => self.admit(k, cid, len, write, now),
            Action::Io { cid, op, .. } => self.io(k, cid, op, now),
            Action::DropAer { cid, cntlid } => self.target.drop_async_event(cntlid, cid),
            Action::Close => {}
        }
    }

    fn connect(&mut self, k: u64, cid: u16, sqe: &proto::nvme::Sqe, data: &[u8], now: Nanos) {
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        let access = &self.catalog.access;
        let addr = Some(c.peer.ip());
        let allowed = |i: usize, host: &str| {
            let client = Client {
                addr,
                cert_name: None,
                hostnqn: Some(host.to_string()),
            };
            access
                .exports
                .get(i)
                .map_or(Access::ReadWrite, |(_, r)| r.access(&client))
        };
        let r = self.target.connect_with(sqe, data, now, &allowed);
        match &r {
            Ok(b) => {
                c.bound = Some((b.cntlid, b.qid));
                let host = self
                    .target
                    .controller(b.cntlid)
                    .map(|ct| host_id(&ct.hostnqn))
                    .unwrap_or(c.flow);
                self.pacer.open_flow(c.flow, host);
                tracing::info!(peer = %c.peer, cntlid = b.cntlid, qid = b.qid, "nvme/tcp: connected");
            }
            Err((s, dw0)) => {
                tracing::info!(peer = %c.peer, status = ?s, dw0, "nvme/tcp: connect refused");
            }
        }
        c.queue.connected(cid, r);
    }

    /// The export (device queue, tenant) behind connection `k`'s subsystem.
    fn export_of(&self, k: u64) -> Option<usize> {
        let c = self.conns.get(&k)?;
        let b = c.queue.bound()?;
        b.subsys
    }

    /// A data command asks for admission: to the pacer, unless the
    /// connection already has `CONN_ADMITTED_CAP` bytes admitted (then it
    /// waits its turn on the connection, holding no memory).
    fn admit(&mut self, k: u64, cid: u16, len: u32, write: bool, now: Nanos) {
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        let full = c.admitted > 0 && c.admitted + u64::from(len) > CONN_ADMITTED_CAP;
        if full || !c.waiting.is_empty() {
            c.waiting.push_back((cid, len, write));
            return;
        }
        self.enqueue(k, cid, len, write, now);
    }

    fn enqueue(&mut self, k: u64, cid: u16, len: u32, write: bool, now: Nanos) {
        let Some(e) = self.export_of(k).and_then(|i| self.catalog.exports.get(i)) else {
            return;
        };
        let (device, tenant) = (e.device, e.tenant);
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        let id = self.next_io;
        self.next_io += 1;
        c.paced.insert(cid, id);
        c.admitted += u64::from(len);
        self.paced.insert(id, (k, cid, len));
        let io = PacedIo {
            id,
            flow: c.flow,
            device,
            tenant,
            bytes: len,
            kind: if write { IoKind::Write } else { IoKind::Read },
            offset: 0,
        };
        self.pacer.enqueue(io, now);
    }

    fn io(&mut self, k: u64, cid: u16, op: DevOp, now: Nanos) {
        let Some(export) = self.export_of(k) else {
            return;
        };
        let Some(e) = self.catalog.exports.get(export) else {
            return;
        };
        let bdev = e.bdev.clone();
        let kind = match op {
            DevOp::Read { .. } => IoKind::Read,
            _ => IoKind::Write,
        };
        let id = self.conns.get(&k).and_then(|c| c.paced.get(&cid).copied());
        if let (Some(id), IoKind::Write) = (id, kind) {
            // A write's data has arrived: it goes to its device now (a read
            // is at its device from its release).
            self.pacer.on_device_start(id, now);
        }
        let done = self.dev.run(&bdev, op);
        let end = self.now() + done.delay_ns;
        if let Some(id) = id {
            self.pacer.on_device_complete(id, kind, end - now, end);
        }
        if done.delay_ns > 0 {
            let seq = self.next_io;
            self.next_io += 1;
            self.held.push(Reverse((end, k, cid, seq)));
            self.held_results.insert(seq, done.result);
        } else if let Some(c) = self.conns.get_mut(&k) {
            c.queue.io_done(cid, done.result);
        }
    }

    /// Held completions, pacer releases, keep-alive and connection timers.
    fn timers(&mut self) {
        let now = self.now();
        let change = self.pacing.try_lock().ok().and_then(|mut m| m.take());
        if let Some(cfg) = change {
            tracing::info!(mode = ?cfg.mode, "nvme/tcp: pacing changed");
            self.pacer.reconfigure(cfg, now);
        }
        while let Some(Reverse((at, k, cid, seq))) = self.held.peek().copied() {
            if at > now {
                break;
            }
            self.held.pop();
            let r = self
                .held_results
                .remove(&seq)
                .unwrap_or(Err(Status::INTERNAL_ERROR));
            if let Some(c) = self.conns.get_mut(&k) {
                c.queue.io_done(cid, r);
                self.drive(k);
            }
        }
        let mut out = Vec::new();
        self.pacer.poll(now, &mut out);
        for id in out {
            match self.paced.get(&id).copied() {
                Some((k, cid, _)) if self.conns.contains_key(&k) => {
                    if let Some(c) = self.conns.get_mut(&k) {
                        c.queue.admit(cid);
                    }
                    self.drive(k);
                }
                _ => {
                    self.paced.remove(&id);
                    self.pacer.cancel(id);
                }
            }
        }
        self.controllers(now);
        self.stale(now);
    }

    /// Keep-alive expiry, resets and async events of the controllers.
    fn controllers(&mut self, now: Nanos) {
        self.target.tick(now);
        for cntlid in self.target.take_dropped() {
            let alive = self.target.alive(cntlid);
            let doomed: Vec<u64> = self
                .conns
                .iter()
                .filter(
                    |(_, c)| matches!(c.bound, Some((id, q)) if id == cntlid && (q > 0 || !alive)),
                )
                .map(|(&k, _)| k)
                .collect();
            for k in doomed {
                tracing::info!(
                    cntlid,
                    conn = k,
                    "nvme/tcp: controller gone, closing its queue"
                );
                self.close(k);
            }
        }
        for (cntlid, cid, ev) in self.target.take_events() {
            let admin = self
                .conns
                .iter()
                .find(|(_, c)| c.bound == Some((cntlid, 0)))
                .map(|(&k, _)| k);
            if let Some(k) = admin {
                let d = AdminDone {
                    result: u64::from(ev),
                    ..AdminDone::default()
                };
                if let Some(c) = self.conns.get_mut(&k) {
                    c.queue.admin_done(cid, d);
                }
                self.drive(k);
            }
        }
    }

    /// Connections that never sent ICReq, or stopped halfway through a PDU.
    fn stale(&mut self, now: Nanos) {
        let t = self.timeouts;
        let stale: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                let no_ic = c.queue.digests().is_none() && now - c.accepted_at > t.handshake;
                let stalled = c.partial() && now - c.last_rx > t.stalled_pdu;
                no_ic || stalled
            })
            .map(|(&k, _)| k)
            .collect();
        for k in stale {
            tracing::info!(conn = k, "nvme/tcp: closing a connection that stalled");
            self.close(k);
        }
    }

    /// Closes connection `k`: its commands are dropped and their pacer
    /// entries cancelled, its queue leaves its controller.
    fn close(&mut self, k: u64) {
        let Some(mut c) = self.conns.remove(&k) else {
            return;
        };
        c.queue.abort_all();
        for (_, id) in c
            .paced
            .drain()
            .chain(c.leaving.drain(..).map(|(_, id)| (0, id)))
        {
            self.paced.remove(&id);
            self.pacer.cancel(id);
        }
        self.pacer.close_flow(c.flow);
        if let Some((cntlid, qid)) = c.bound {
            self.target.queue_closed(cntlid, qid);
        }
        tracing::info!(peer = %c.peer, conn = k, "nvme/tcp: connection closed");
    }
}

/// A host id for the pacer from a host NQN: its queues share one host.
fn host_id(nqn: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    nqn.hash(&mut h);
    h.finish() | (1 << 63)
}
