//! One reactor per core: one io_uring for sockets and disks, its own
//! connections, request slots and buffer cache. One submit-and-wait per loop.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bdev::{IoOp, IoResult, Prep};
use io_uring::{opcode, squeue, types, IoUring};
use pace::pacer::{
    DeviceOps, DeviceQos, IoKind, LinkWindow, PacedIo, Pacer, PacingConfig, TenantClock,
};
use pace::pool::{Alloc, BufId, ReactorBufs, SharedPool};
use pace::stats::ReqState;
use pace::Nanos;
use proto::{Command, Handshake, HandshakeStatus};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::conn::{Block, Conn, Phase, DIRECT_RECV_MIN, MAX_SEND_IOV};
use crate::exports::Catalog;
use crate::req::Req;
use crate::stats::{ReactorStats, StatsCollector};

/// Messages from other threads, delivered through the inbox and an eventfd.
pub enum Msg {
    NewConn(OwnedFd),
    Stats(mpsc::Sender<ReactorStats>),
    SetPacing(PacingConfig),
    Shutdown,
}

/// The part of a reactor other threads may touch.
pub struct ReactorHandle {
    eventfd: OwnedFd,
    inbox: Mutex<Vec<Msg>>,
    /// Live connections, read by the acceptor to balance reactors.
    pub conns: AtomicUsize,
}

impl ReactorHandle {
    pub fn new() -> io::Result<Arc<ReactorHandle>> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(ReactorHandle {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
            inbox: Mutex::new(Vec::new()),
            conns: AtomicUsize::new(0),
        }))
    }

    pub fn send(&self, msg: Msg) {
        if let Ok(mut inbox) = self.inbox.lock() {
            inbox.push(msg);
        }
        self.wake();
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd. A full
        // counter (EAGAIN) still means the reactor will wake.
        unsafe {
            libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }
}

// user_data layout: kind in the top byte, generation in the next 24 bits,
// slot index in the low 32 bits.
const UD_RECV: u64 = 1;
const UD_SEND: u64 = 2;
const UD_BDEV: u64 = 3;
const UD_EVENT: u64 = 4;

fn ud(kind: u64, gen: u32, index: u32) -> u64 {
    (kind << 56) | ((u64::from(gen) & 0xff_ffff) << 32) | u64::from(index)
}

/// Generation field of a bdev SQE: the last of its chain, or an earlier one
/// (which completes only on error).
const CHAIN_TAIL: u32 = 0;
const CHAIN_LINK: u32 = 1;

fn ud_parts(v: u64) -> (u64, u32, u32) {
    (v >> 56, ((v >> 32) & 0xff_ffff) as u32, v as u32)
}

pub struct ReactorSettings {
    pub id: usize,
    /// Per-device op credit shared by every reactor (rate mode).
    pub device_ops: Option<Arc<DeviceOps>>,
    /// Tenants' virtual time, one clock for every reactor.
    pub tenant_clock: Arc<TenantClock>,
    /// Devices' latency targets and budgets, one for every reactor.
    pub device_qos: Arc<DeviceQos>,
    /// Every reactor's pacing window, pooled (`auto`).
    pub link_window: Arc<LinkWindow>,
    pub max_requests: u32,
    pub drain_timeout: Duration,
}

pub struct Reactor {
    id: usize,
    ring: IoUring,
    handle: Arc<ReactorHandle>,
    event_buf: Box<u64>,
    catalog: Arc<Catalog>,
    pool: Arc<SharedPool>,
    bufs: ReactorBufs,
    conns: Vec<Option<Box<Conn>>>,
    conn_gens: Vec<u32>,
    free_conns: Vec<u32>,
    reqs: Vec<Req>,
    free_reqs: Vec<u32>,
    /// Connections that stopped parsing for lack of a request slot.
    slot_waiters: Vec<u32>,
    /// Connections with replies to send at the end of this iteration.
    send_ready: Vec<u32>,
    /// Completions held back by delay bdevs: (release time, request).
    timers: BinaryHeap<Reverse<(Nanos, u32)>>,
    grants: Vec<(u64, Vec<BufId>)>,
    pacer: Pacer,
    /// Scratch list of IOs the pacer released.
    released: Vec<u64>,
    /// Scratch list of requests whose replies were fully sent.
    finished: Vec<u32>,
    rng: SmallRng,
    origin: Instant,
    now: Nanos,
    stats: StatsCollector,
    draining_since: Option<Nanos>,
    drain_timeout: Duration,
}

impl Reactor {
    pub fn new(
        settings: ReactorSettings,
        handle: Arc<ReactorHandle>,
        catalog: Arc<Catalog>,
        pool: Arc<SharedPool>,
        origin: Instant,
    ) -> io::Result<Reactor> {
        let entries = (settings.max_requests + 1024)
            .next_power_of_two()
            .min(32768);
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))?;
        let waker_handle = handle.clone();
        let bufs = pool.register_reactor(Box::new(move || waker_handle.wake()));
        let reqs = (0..settings.max_requests).map(|_| Req::default()).collect();
        let free_reqs = (0..settings.max_requests).rev().collect();
        let stats = StatsCollector::new(settings.id, &catalog, pool.buffer_size());
        let origin_now = origin.elapsed().as_nanos() as Nanos;
        let mut pacer = Pacer::new(
            catalog.pacing.clone(),
            catalog.devices.len(),
            pool.buffer_size(),
            settings.device_ops.clone(),
            origin_now,
        );
        for (i, model) in catalog.devices.iter().enumerate() {
            pacer.set_cost_model(i, model.cost);
        }
        pacer.share_tenants(settings.tenant_clock.clone());
        pacer.share_qos(settings.device_qos.clone());
        pacer.share_link(settings.link_window.clone(), settings.id);
        Ok(Reactor {
            id: settings.id,
            ring,
            handle,
            event_buf: Box::new(0),
            catalog,
            pool,
            bufs,
            conns: Vec::new(),
            conn_gens: Vec::new(),
            free_conns: Vec::new(),
            reqs,
            free_reqs,
            slot_waiters: Vec::new(),
            send_ready: Vec::new(),
            timers: BinaryHeap::new(),
            grants: Vec::new(),
            pacer,
            released: Vec::new(),
            finished: Vec::new(),
            rng: SmallRng::seed_from_u64(0x10_9ace ^ settings.id as u64),
            origin,
            now: 0,
            stats,
            draining_since: None,
            drain_timeout: settings.drain_timeout,
        })
    }

    fn clock(&mut self) -> Nanos {
        self.now = self.origin.elapsed().as_nanos() as Nanos;
        self.now
    }

    /// Runs until shutdown and every connection has drained.
    pub fn run(mut self) -> io::Result<()> {
        self.arm_eventfd();
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(1024);
        loop {
            self.clock();
            self.bufs.poll(&mut self.grants);
            self.handle_grants();
            self.fire_timers();
            self.poll_pacer();
            self.flush_sends();
            if self.draining_since.is_some() && self.finish_drain() {
                break;
            }
            // Buffers held stay constant while the reactor waits.
            self.stats.sample_buffers(self.now, self.bufs.in_use());
            let timeout = self.next_timeout();
            let r = match timeout {
                Some(ts) => {
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                None => self.ring.submitter().submit_and_wait(1),
            };
            if let Err(e) = r {
                match e.raw_os_error() {
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => {}
                    _ => return Err(e),
                }
            }
            self.stats.loops += 1;
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            self.clock();
            for &(user_data, res) in &cqes {
                self.dispatch(user_data, res);
            }
        }
        Ok(())
    }

    fn next_timeout(&self) -> Option<types::Timespec> {
        let mut deadline = self.timers.peek().map(|Reverse((t, _))| *t);
        if let Some(t) = self.pacer.next_wakeup(self.now) {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        if let Some(since) = self.draining_since {
            // Wake up to re-check the drain even when nothing completes.
            let check = since.max(self.now) + 50_000_000;
            deadline = Some(deadline.map_or(check, |d| d.min(check)));
        }
        let wait = deadline?.saturating_sub(self.now).max(1_000);
        Some(
            types::Timespec::new()
                .sec(wait / 1_000_000_000)
                .nsec((wait % 1_000_000_000) as u32),
        )
    }

    fn push_sqe(&mut self, sqe: squeue::Entry) {
        loop {
            // SAFETY: every SQE built here points at memory that lives until
            // its completion: connection buffers are boxed and only freed
            // once idle, request buffers are released after completion.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                tracing::warn!(reactor = self.id, "submit while SQ full: {e}");
            }
        }
    }

    fn arm_eventfd(&mut self) {
        let ptr = (&mut *self.event_buf as *mut u64).cast::<u8>();
        let sqe = opcode::Read::new(types::Fd(self.handle.eventfd.as_raw_fd()), ptr, 8)
            .build()
            .user_data(ud(UD_EVENT, 0, 0));
        self.push_sqe(sqe);
    }

    fn dispatch(&mut self, user_data: u64, res: i32) {
        let (kind, gen, index) = ud_parts(user_data);
        match kind {
            UD_EVENT => {
                self.arm_eventfd();
                self.drain_inbox();
            }
            UD_RECV => self.on_recv(index, gen, res),
            UD_SEND => self.on_send(index, gen, res),
            UD_BDEV => self.on_bdev_cqe(index, gen, res),
            _ => tracing::error!(reactor = self.id, user_data, "unknown completion"),
        }
    }

    fn drain_inbox(&mut self) {
        let msgs = match self.handle.inbox.lock() {
            Ok(mut inbox) => std::mem::take(&mut *inbox),
            Err(_) => return,
        };
        for msg in msgs {
            match msg {
                Msg::NewConn(fd) => self.add_conn(fd),
                Msg::Stats(reply) => {
                    let snapshot = self.snapshot();
                    let _ = reply.send(snapshot);
                }
                Msg::SetPacing(cfg) => self.pacer.reconfigure(cfg, self.now),
                Msg::Shutdown => self.begin_drain(),
            }
        }
    }

    // ---- connections ----------------------------------------------------

    fn conn(&mut self, index: u32) -> Option<&mut Conn> {
        self.conns.get_mut(index as usize)?.as_deref_mut()
    }

    fn conn_live(&self, index: u32, gen: u32) -> bool {
        matches!(self.conns.get(index as usize), Some(Some(c)) if c.gen == gen)
    }

    fn add_conn(&mut self, fd: OwnedFd) {
        if self.draining_since.is_some() {
            self.handle.conns.fetch_sub(1, Ordering::Relaxed);
            return; // dropping the fd closes it
        }
        let handshake = Handshake::new(self.catalog.infos.clone(), self.catalog.default_export);
        let index = match self.free_conns.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conn_gens.push(0);
                (self.conns.len() - 1) as u32
            }
        };
        let gen = (self.conn_gens[index as usize].wrapping_add(1)) & 0xff_ffff;
        self.conn_gens[index as usize] = gen;
        let mut conn = Box::new(Conn::new(fd, gen, handshake));
        if let Phase::Handshake(h) = &mut conn.phase {
            conn.raw_out = h.take_output();
        }
        self.conns[index as usize] = Some(conn);
        self.stats.conns_total += 1;
        self.stats.conns_now += 1;
        self.mark_send(index);
        self.post_recv(index);
    }

    fn post_recv(&mut self, index: u32) {
        let Some(Some(c)) = self.conns.get_mut(index as usize) else {
            return;
        };
        if c.recv_inflight || c.closing || c.input_done || c.block != Block::None {
            return;
        }
        // A large write payload goes straight into its data buffers.
        let direct = match c.filling {
            Some(r) if c.buffered() == 0 => self.reqs[r as usize]
                .payload_target(DIRECT_RECV_MIN)
                .map(|t| (r, t)),
            _ => None,
        };
        let (ptr, len) = match direct {
            Some((_, t)) => t,
            None => recv_window(c),
        };
        if len == 0 {
            return;
        }
        c.recv_direct = direct.map(|(r, _)| r);
        c.recv_inflight = true;
        let sqe = opcode::Recv::new(types::Fd(c.raw_fd()), ptr, len as u32)
            .build()
            .user_data(ud(UD_RECV, c.gen, index));
        self.push_sqe(sqe);
    }

    fn on_recv(&mut self, index: u32, gen: u32, res: i32) {
        let Some(Some(c)) = self.conns.get_mut(index as usize) else {
            return;
        };
        if c.gen != gen {
            return;
        }
        c.recv_inflight = false;
        let direct = c.recv_direct.take();
        if c.closing {
            self.try_close(index);
            return;
        }
        if res < 0 {
            tracing::debug!(
                reactor = self.id,
                conn = index,
                "recv: {}",
                io::Error::from_raw_os_error(-res)
            );
            self.begin_close(index);
            return;
        }
        if res == 0 {
            // EOF: the client is done sending; finish what it asked, then close.
            self.input_ended(index);
            return;
        }
        let n = res as usize;
        self.stats.bytes_in += n as u64;
        match direct {
            Some(r) => {
                let req = &mut self.reqs[r as usize];
                req.filled += n as u32;
                if req.filled == req.len {
                    c.filling = None;
                    self.execute(r);
                }
            }
            None => c.rend += n,
        }
        self.process_input(index);
        self.post_recv(index);
    }

    /// No more input from this connection: serve what is in flight, then close.
    fn input_ended(&mut self, index: u32) {
        let Some(c) = self.conn(index) else { return };
        c.input_done = true;
        if let Some(r) = c.filling.take() {
            // A write whose payload never arrived: nothing to execute.
            self.release_req(r);
        }
        self.maybe_finish_conn(index);
    }

    fn maybe_finish_conn(&mut self, index: u32) {
        let Some(c) = self.conn(index) else { return };
        if c.input_done
            && c.inflight == 0
            && !c.send_inflight
            && c.raw_out.is_empty()
            && c.out.is_empty()
        {
            self.begin_close(index);
        }
    }

    /// Shuts the socket down and releases everything not in the kernel's hands.
    fn begin_close(&mut self, index: u32) {
        let Some(c) = self.conn(index) else { return };
        if c.closing {
            self.try_close(index);
            return;
        }
        c.closing = true;
        c.input_done = true;
        // SAFETY: shutting down our own socket; in-flight recv/send complete.
        unsafe {
            libc::shutdown(c.raw_fd(), libc::SHUT_RDWR);
        }
        let gen = c.gen;
        if let Some(r) = c.filling.take() {
            self.release_req(r);
        }
        let Some(c) = self.conn(index) else { return };
        if !c.send_inflight {
            let queued: Vec<u32> = c.out.drain(..).collect();
            c.out_skip = 0;
            for r in queued {
                self.release_req(r);
            }
        }
        // Requests still queued for buffers leave the wait queue now.
        for i in 0..self.reqs.len() as u32 {
            let req = &self.reqs[i as usize];
            if req.conn == index && req.conn_gen == gen {
                match req.state {
                    ReqState::NeedBuffer => {
                        self.bufs.cancel(u64::from(i));
                        self.release_req(i);
                    }
                    // release_req takes it out of the pacer.
                    ReqState::Pacing => self.release_req(i),
                    _ => {}
                }
            }
        }
        self.slot_waiters.retain(|&w| w != index);
        self.try_close(index);
    }

    fn try_close(&mut self, index: u32) {
        let Some(c) = self.conn(index) else { return };
        if !c.closing || !c.idle() {
            return;
        }
        self.conns[index as usize] = None; // drops and closes the fd
        self.free_conns.push(index);
        self.stats.conns_now -= 1;
        self.handle.conns.fetch_sub(1, Ordering::Relaxed);
    }

    // ---- requests ---------------------------------------------------------

    fn process_input(&mut self, index: u32) {
        loop {
            let Some(Some(c)) = self.conns.get_mut(index as usize) else {
                return;
            };
            if c.closing || c.block != Block::None {
                break;
            }
            if let Phase::Handshake(h) = &mut c.phase {
                let consumed = h.feed(&c.rbuf[c.rstart..c.rend]);
                c.rstart += consumed;
                let out = h.take_output();
                c.raw_out.extend_from_slice(&out);
                match h.status().clone() {
                    HandshakeStatus::Negotiating => {
                        c.compact();
                        self.mark_send(index);
                        return;
                    }
                    HandshakeStatus::Done(neg) => {
                        let export = neg.export_index as u16;
                        c.phase = Phase::Transmission { export, neg };
                        self.mark_send(index);
                        continue;
                    }
                    HandshakeStatus::Closed => {
                        c.input_done = true;
                        self.mark_send(index);
                        self.maybe_finish_conn(index);
                        return;
                    }
                }
            }
            if let Some(r) = c.filling {
                let avail = c.buffered();
                if avail == 0 {
                    break;
                }
                let req = &mut self.reqs[r as usize];
                let n = avail.min((req.len - req.filled) as usize);
                req.fill_from(&c.rbuf[c.rstart..c.rstart + n]);
                c.rstart += n;
                if req.filled == req.len {
                    c.filling = None;
                    self.execute(r);
                }
                continue;
            }
            if c.skip > 0 {
                let n = (c.buffered() as u64).min(c.skip);
                if n == 0 {
                    break;
                }
                c.rstart += n as usize;
                c.skip -= n;
                continue;
            }
            if c.input_done {
                break;
            }
            let request = match proto::decode_request(&c.rbuf[c.rstart..c.rend]) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::info!(reactor = self.id, conn = index, "closing connection: {e:?}");
                    self.stats.protocol_errors += 1;
                    self.begin_close(index);
                    return;
                }
            };
            let Some(slot) = self.free_reqs.pop() else {
                c.block = Block::Slot;
                self.slot_waiters.push(index);
                break;
            };
            c.rstart += proto::REQUEST_HEADER_LEN;
            self.accept_request(index, slot, request);
        }
        if let Some(Some(c)) = self.conns.get_mut(index as usize) {
            c.compact();
        }
    }

    fn accept_request(&mut self, index: u32, slot: u32, request: proto::Request) {
        let now = self.now;
        let Some(Some(c)) = self.conns.get_mut(index as usize) else {
            return;
        };
        let Phase::Transmission { export, neg } = &c.phase else {
            return;
        };
        let export = *export;
        let structured = neg.structured_replies;
        let meta_context = neg.base_allocation.unwrap_or(0);
        let gen = c.gen;
        c.inflight += 1;
        let info = &self.catalog.exports[export as usize].info;
        let verdict = proto::validate(&request, info, neg);
        let req = &mut self.reqs[slot as usize];
        req.reset(index, gen, export, &request, now, structured, meta_context);
        self.stats.enter(ReqState::New);
        if request.command == Command::Disc {
            // No reply; serve what is in flight, then close.
            self.release_req(slot);
            self.input_ended(index);
            return;
        }
        if let Err(errno) = verdict {
            let payload = u64::from(request.payload_len());
            self.reqs[slot as usize].error = errno;
            self.stats.rejected += 1;
            if payload > u64::from(MAX_DISCARD_PAYLOAD) {
                // Discarding gigabytes of junk is not worth it: drop the client.
                self.release_req(slot);
                self.begin_close(index);
                return;
            }
            if let Some(c) = self.conn(index) {
                c.skip = payload;
            }
            self.complete(slot);
            return;
        }
        let needs_buffers =
            matches!(request.command, Command::Read | Command::Write) && request.length > 0;
        if !needs_buffers {
            if request.command == Command::Write {
                // Zero-length write: nothing to do but answer.
                self.complete(slot);
            } else {
                self.execute(slot);
            }
            return;
        }
        // The pacer decides when the IO may take buffers. A WRITE's payload
        // stays in the socket until then: the connection stops reading.
        let export = &self.catalog.exports[self.reqs[slot as usize].export as usize];
        let io = PacedIo {
            id: u64::from(slot),
            flow: (u64::from(self.conn_gens[index as usize]) << 32) | u64::from(index),
            device: export.device,
            tenant: export.tenant,
            bytes: request.length,
            kind: if request.command == Command::Write {
                IoKind::Write
            } else {
                IoKind::Read
            },
            offset: request.offset,
        };
        if request.command == Command::Write {
            if let Some(c) = self.conn(index) {
                c.block = Block::Buffers(slot);
            }
        }
        self.set_state(slot, ReqState::Pacing);
        self.reqs[slot as usize].paced = true;
        self.pacer.enqueue(io, self.now);
        // Release now if the pacer allows: an unpaced IO (or an open window)
        // must not wait a loop iteration, nor keep its connection blocked.
        self.poll_pacer();
    }

    /// Released by the pacer: take buffers, or queue for them.
    fn paced_release(&mut self, slot: u32) {
        let req = &self.reqs[slot as usize];
        if req.state != ReqState::Pacing {
            return;
        }
        let (len, index, is_write) = (req.len, req.conn, req.command == Command::Write);
        self.set_state(slot, ReqState::NeedBuffer);
        match self.bufs.alloc(len, u64::from(slot)) {
            Alloc::Ready(bufs) => {
                let was_blocking = self.conns[index as usize]
                    .as_ref()
                    .is_some_and(|c| c.block == Block::Buffers(slot));
                self.got_buffers(slot, bufs);
                if was_blocking {
                    self.send_ready.push(index | RESUME_FLAG);
                }
            }
            Alloc::Queued => {
                self.stats.buffer_waits += 1;
                let _ = is_write; // a write keeps its connection blocked
            }
        }
    }

    fn poll_pacer(&mut self) {
        if self.pacer.queued() == 0 {
            return;
        }
        self.pacer.poll(self.now, &mut self.released);
        let released = std::mem::take(&mut self.released);
        for &id in &released {
            self.paced_release(id as u32);
        }
        self.released = released;
        self.released.clear();
    }

    fn got_buffers(&mut self, slot: u32, bufs: Vec<BufId>) {
        let pool = self.pool.clone();
        let req = &mut self.reqs[slot as usize];
        req.attach_buffers(bufs, &pool);
        if req.command == Command::Write {
            let index = req.conn;
            self.set_state(slot, ReqState::Transfer);
            if let Some(c) = self.conn(index) {
                c.filling = Some(slot);
                if c.block == Block::Buffers(slot) {
                    c.block = Block::None;
                }
            }
        } else {
            self.execute(slot);
        }
    }

    fn handle_grants(&mut self) {
        if self.grants.is_empty() {
            return;
        }
        let grants = std::mem::take(&mut self.grants);
        let mut resume = Vec::new();
        for (token, bufs) in grants {
            let slot = token as u32;
            let live = self.reqs.get(slot as usize).is_some_and(|r| {
                r.state == ReqState::NeedBuffer && self.conn_live(r.conn, r.conn_gen)
            });
            if !live {
                self.bufs.free(&bufs);
                continue;
            }
            let index = self.reqs[slot as usize].conn;
            let was_blocking = self.conns[index as usize]
                .as_ref()
                .is_some_and(|c| c.block == Block::Buffers(slot));
            self.got_buffers(slot, bufs);
            if was_blocking {
                resume.push(index);
            }
        }
        for index in resume {
            self.process_input(index);
            self.post_recv(index);
        }
    }

    fn set_state(&mut self, slot: u32, state: ReqState) {
        let req = &mut self.reqs[slot as usize];
        self.stats.transition(req.state, state);
        req.state = state;
    }

    /// Sends the request to its bdev.
    fn execute(&mut self, slot: u32) {
        self.set_state(slot, ReqState::Executing);
        let now = self.now;
        let req = &mut self.reqs[slot as usize];
        req.t_submit = now;
        let dev = self.catalog.exports[req.export as usize].bdev.clone();
        let op = match req.command {
            Command::Read => IoOp::Read,
            Command::Write => IoOp::Write {
                fua: req.flags & proto::CMD_FLAG_FUA != 0,
            },
            Command::Flush => IoOp::Flush,
            Command::Trim => IoOp::Trim {
                fua: req.flags & proto::CMD_FLAG_FUA != 0,
            },
            Command::WriteZeroes => IoOp::WriteZeroes {
                may_trim: req.flags & proto::CMD_FLAG_NO_HOLE == 0,
                fua: req.flags & proto::CMD_FLAG_FUA != 0,
            },
            Command::Cache => IoOp::Cache,
            Command::BlockStatus => {
                let mut extents = dev.block_status(req.offset, req.len);
                if req.flags & proto::CMD_FLAG_REQ_ONE != 0 {
                    extents.truncate(1);
                }
                req.block_status(&extents);
                self.complete(slot);
                return;
            }
            Command::Disc | Command::Unknown(_) => {
                req.error = proto::EINVAL;
                self.complete(slot);
                return;
            }
        };
        req.op = Some(op);
        req.chain_error = None;
        let io = req.io_request(op);
        // SAFETY: the iovecs point at pool buffers this request owns until
        // it is released, which happens only after the bdev completes.
        let prep = unsafe { dev.prepare(&io) };
        match prep {
            Prep::Done(result) => self.bdev_done(slot, result),
            Prep::Sqes(sqes) => {
                let last = sqes.len().saturating_sub(1);
                for (i, sqe) in sqes.into_iter().enumerate() {
                    let link = if i == last { CHAIN_TAIL } else { CHAIN_LINK };
                    self.push_sqe(sqe.user_data(ud(UD_BDEV, link, slot)));
                }
            }
        }
    }

    fn on_bdev_cqe(&mut self, slot: u32, link: u32, res: i32) {
        let req = &mut self.reqs[slot as usize];
        let Some(op) = req.op else { return };
        let dev = self.catalog.exports[req.export as usize].bdev.clone();
        let io = req.io_request(op);
        if link == CHAIN_LINK {
            // An earlier SQE of a chain failed; the tail still completes (cancelled).
            req.chain_error = Some(dev.complete(&io, res));
            return;
        }
        let result = match req.chain_error.take() {
            Some(e) => e,
            None => dev.complete(&io, res),
        };
        self.bdev_done(slot, result);
    }

    fn bdev_done(&mut self, slot: u32, result: IoResult) {
        let req = &mut self.reqs[slot as usize];
        if let IoResult::Err(errno) = result {
            req.error = errno;
        }
        let dev = &self.catalog.exports[req.export as usize].bdev;
        if dev.has_delay() {
            if let Some(op) = req.op {
                let hold = dev.sample_delay_ns(op, &mut self.rng);
                let release = req.t_submit + hold;
                if release > self.now {
                    self.timers.push(Reverse((release, slot)));
                    return;
                }
            }
        }
        self.device_finished(slot);
        self.complete(slot);
    }

    /// The device (with its emulated delay) has finished the request: its
    /// time at the device feeds the pacer's estimates and latency targets.
    fn device_finished(&mut self, slot: u32) {
        let req = &self.reqs[slot as usize];
        if !req.paced {
            return;
        }
        let device = self.catalog.exports[req.export as usize].device;
        let kind = if req.op.is_some_and(|op| op.is_write()) {
            IoKind::Write
        } else {
            IoKind::Read
        };
        self.pacer.on_device_complete(
            device,
            kind,
            self.now.saturating_sub(req.t_submit),
            self.now,
        );
    }

    fn fire_timers(&mut self) {
        while let Some(Reverse((t, slot))) = self.timers.peek().copied() {
            if t > self.now {
                break;
            }
            self.timers.pop();
            self.device_finished(slot);
            self.complete(slot);
        }
    }

    /// The request is answered: queue its reply (or drop it if the client is gone).
    fn complete(&mut self, slot: u32) {
        let req = &self.reqs[slot as usize];
        let (index, gen) = (req.conn, req.conn_gen);
        let open =
            matches!(self.conns.get(index as usize), Some(Some(c)) if c.gen == gen && !c.closing);
        if !open {
            self.release_req(slot);
            if self.conn_live(index, gen) {
                self.try_close(index);
            }
            return;
        }
        self.reqs[slot as usize].encode_reply();
        self.set_state(slot, ReqState::Transfer);
        if let Some(c) = self.conn(index) {
            c.out.push_back(slot);
        }
        self.mark_send(index);
    }

    /// Frees the request's buffers and slot: the end of its life.
    fn release_req(&mut self, slot: u32) {
        let req = &mut self.reqs[slot as usize];
        if req.paced {
            // Never reached on_complete (cancelled or failed): leave the pacer.
            self.pacer.cancel(u64::from(slot));
            req.paced = false;
        }
        if !req.bufs.is_empty() {
            self.bufs.free(&req.bufs);
        }
        let state = req.state;
        let index = req.conn;
        let gen = req.conn_gen;
        req.clear();
        self.stats.leave(state);
        self.free_reqs.push(slot);
        if let Some(Some(c)) = self.conns.get_mut(index as usize) {
            if c.gen == gen {
                c.inflight -= 1;
            }
        }
        if let Some(waiter) = self.slot_waiters.pop() {
            if let Some(c) = self.conn(waiter) {
                if c.block == Block::Slot {
                    c.block = Block::None;
                }
            }
            self.send_ready.push(waiter | RESUME_FLAG);
        }
    }

    // ---- sending ------------------------------------------------------------

    fn mark_send(&mut self, index: u32) {
        if let Some(c) = self.conn(index) {
            if !c.send_queued {
                c.send_queued = true;
                self.send_ready.push(index);
            }
        }
    }

    fn flush_sends(&mut self) {
        while !self.send_ready.is_empty() {
            let ready = std::mem::take(&mut self.send_ready);
            for entry in ready {
                if entry & RESUME_FLAG != 0 {
                    let index = entry & !RESUME_FLAG;
                    self.process_input(index);
                    self.post_recv(index);
                    continue;
                }
                if let Some(c) = self.conn(entry) {
                    c.send_queued = false;
                }
                self.start_send(entry);
            }
        }
    }

    fn start_send(&mut self, index: u32) {
        let Some(c) = self
            .conns
            .get_mut(index as usize)
            .and_then(|c| c.as_deref_mut())
        else {
            return;
        };
        if c.send_inflight || c.closing {
            return;
        }
        c.send_iov.clear();
        if !c.raw_out.is_empty() || !c.raw_sending.is_empty() {
            if c.raw_sending.is_empty() {
                std::mem::swap(&mut c.raw_out, &mut c.raw_sending);
            }
            c.send_iov.push(libc::iovec {
                iov_base: c.raw_sending.as_mut_ptr().cast(),
                iov_len: c.raw_sending.len(),
            });
        } else {
            let mut skip = c.out_skip;
            for &slot in c.out.iter() {
                let req = &self.reqs[slot as usize];
                if c.send_iov.len() + 1 + req.iov.len() > MAX_SEND_IOV {
                    break;
                }
                req.push_reply_iov(&mut c.send_iov, skip);
                skip = 0;
            }
        }
        if c.send_iov.is_empty() {
            if c.input_done {
                self.maybe_finish_conn(index);
            }
            return;
        }
        let Some(c) = self
            .conns
            .get_mut(index as usize)
            .and_then(|c| c.as_deref_mut())
        else {
            return;
        };
        c.msg.msg_iov = c.send_iov.as_mut_ptr();
        c.msg.msg_iovlen = c.send_iov.len();
        c.send_inflight = true;
        let sqe = opcode::SendMsg::new(types::Fd(c.raw_fd()), &*c.msg as *const libc::msghdr)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(ud(UD_SEND, c.gen, index));
        self.push_sqe(sqe);
    }

    fn on_send(&mut self, index: u32, gen: u32, res: i32) {
        let now = self.now;
        let Some(Some(c)) = self.conns.get_mut(index as usize) else {
            return;
        };
        if c.gen != gen {
            return;
        }
        c.send_inflight = false;
        if c.closing {
            let queued: Vec<u32> = c.out.drain(..).collect();
            for r in queued {
                self.release_req(r);
            }
            self.try_close(index);
            return;
        }
        if res < 0 {
            tracing::debug!(
                reactor = self.id,
                conn = index,
                "send: {}",
                io::Error::from_raw_os_error(-res)
            );
            self.begin_close(index);
            return;
        }
        let mut sent = res as usize;
        self.stats.bytes_out += sent as u64;
        if !c.raw_sending.is_empty() {
            c.raw_sending.drain(..sent.min(c.raw_sending.len()));
        } else {
            while let Some(&slot) = c.out.front() {
                let size = self.reqs[slot as usize].reply_len() - c.out_skip;
                if sent < size {
                    c.out_skip += sent;
                    break;
                }
                sent -= size;
                c.out_skip = 0;
                c.out.pop_front();
                self.finished.push(slot);
            }
            let finished = std::mem::take(&mut self.finished);
            for &slot in &finished {
                self.stats.record_done(&self.reqs[slot as usize], now);
                if self.reqs[slot as usize].paced {
                    self.pacer.on_complete(u64::from(slot), now);
                    self.reqs[slot as usize].paced = false;
                }
                self.release_req(slot);
            }
            self.finished = finished;
            self.finished.clear();
        }
        self.mark_send(index);
        self.maybe_finish_conn(index);
    }

    // ---- shutdown and stats -----------------------------------------------

    fn begin_drain(&mut self) {
        if self.draining_since.is_some() {
            return;
        }
        self.draining_since = Some(self.now);
        for index in 0..self.conns.len() as u32 {
            let Some(c) = self.conn(index) else { continue };
            c.input_done = true;
            // Wake the pending recv; in-flight requests still get answers.
            // SAFETY: shutting down reading on our own socket.
            unsafe {
                libc::shutdown(c.raw_fd(), libc::SHUT_RD);
            }
            if c.filling.is_some() || matches!(c.block, Block::Buffers(_)) {
                self.begin_close(index);
                continue;
            }
            self.maybe_finish_conn(index);
        }
    }

    /// True when every connection is gone (or the drain timed out).
    fn finish_drain(&mut self) -> bool {
        let Some(since) = self.draining_since else {
            return false;
        };
        let open: Vec<u32> = (0..self.conns.len() as u32)
            .filter(|&i| self.conns[i as usize].is_some())
            .collect();
        if open.is_empty() {
            return true;
        }
        if self.now.saturating_sub(since) > self.drain_timeout.as_nanos() as u64 {
            tracing::warn!(
                reactor = self.id,
                open = open.len(),
                "drain timed out; closing connections"
            );
            for index in open {
                self.begin_close(index);
            }
            // Closed sockets complete their pending ops promptly.
            return self.conns.iter().all(Option::is_none)
                || self.now.saturating_sub(since) > 2 * self.drain_timeout.as_nanos() as u64;
        }
        false
    }

    fn snapshot(&mut self) -> ReactorStats {
        let now = self.clock();
        let pool = self.bufs.stats();
        let mut snap = self
            .stats
            .snapshot(now, pool, self.pool.free_total(), self.timers.len());
        snap.pacer = serde_json::to_value(self.pacer.stats(now)).unwrap_or_default();
        snap
    }
}

/// Rejected WRITE payloads up to this size are read and discarded, as the
/// spec prefers; larger ones close the connection instead.
const MAX_DISCARD_PAYLOAD: u32 = 64 << 20;

/// Marks a `send_ready` entry as "resume parsing" rather than "send".
const RESUME_FLAG: u32 = 1 << 31;

fn recv_window(c: &mut Conn) -> (*mut u8, usize) {
    c.compact();
    let len = c.rbuf.len() - c.rend;
    // SAFETY: rend <= rbuf.len(), so the pointer stays inside the buffer.
    (unsafe { c.rbuf.as_mut_ptr().add(c.rend) }, len)
}
