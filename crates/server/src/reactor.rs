//! One reactor per core: one io_uring for sockets and disks, its own
//! engine (connections, requests, buffer cache, pacer). The reactor is the
//! engine's io_uring driver: it executes the engine's actions as SQEs and
//! feeds completions back. One submit-and-wait per loop.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bdev::{IoResult, Prep};
use io_uring::{opcode, squeue, types};
use pace::pacer::{PacerGroup, PacingConfig};
use pace::Nanos;
use pool::SharedPool;

use crate::engine::{
    Action, ConnId, Engine, EngineSettings, IoToken, Received, Sent, Timeouts, PAYLOAD_CAP,
};
use crate::exports::Catalog;
use crate::gather::GatherTrial;
use crate::ring::Ring;
use crate::sockets::{is_nonblocking, is_unix, set_nonblocking, set_send_buffer};
use crate::splice::{self, Pipe};
use crate::stats::ReactorStats;
use config::{PollMode, SpliceMode};

/// Messages from other threads, delivered through the inbox and an eventfd.
pub enum Msg {
    /// A connection and its peer's description.
    NewConn(OwnedFd, String),
    /// A connection whose handshake began elsewhere (a TLS listener's
    /// thread): resume it. The fd is plaintext (a TLS relay's socketpair end).
    Resume(OwnedFd, Box<proto::Handshake>, String),
    Stats(mpsc::Sender<ReactorStats>),
    /// The requests in flight a trace query names, with their state changes.
    Trace(
        crate::engine::TraceQuery,
        mpsc::Sender<Vec<crate::engine::TracedReq>>,
    ),
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

/// What a completion is for: the tag each SQE carries in its user data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// The inbox's eventfd.
    Event,
    Recv(ConnId),
    Send(ConnId),
    /// A splicing send's socket became writable (a poll).
    Splice(ConnId),
    /// A device IO's SQE; `link` for an earlier SQE of a linked chain, which
    /// completes only on error.
    Io {
        io: IoToken,
        link: bool,
    },
}

// Layout: the kind in the top 4 bits; a connection's generation (24 bits)
// above its index (32 bits); an IO's 56-bit token, with bit 56 for `link`.
const OP_EVENT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;
const OP_IO: u64 = 4;
const OP_SPLICE: u64 = 5;

impl Op {
    fn encode(self) -> u64 {
        let conn = |c: ConnId| (u64::from(c.gen) << 32) | u64::from(c.index);
        match self {
            Op::Event => OP_EVENT << 60,
            Op::Recv(c) => (OP_RECV << 60) | conn(c),
            Op::Send(c) => (OP_SEND << 60) | conn(c),
            Op::Splice(c) => (OP_SPLICE << 60) | conn(c),
            Op::Io { io, link } => (OP_IO << 60) | (u64::from(link) << 56) | io.encode(),
        }
    }

    fn decode(v: u64) -> Option<Op> {
        let conn = || ConnId {
            index: v as u32,
            gen: ((v >> 32) & 0xff_ffff) as u32,
        };
        Some(match v >> 60 {
            OP_EVENT => Op::Event,
            OP_RECV => Op::Recv(conn()),
            OP_SEND => Op::Send(conn()),
            OP_SPLICE => Op::Splice(conn()),
            OP_IO => Op::Io {
                io: IoToken::decode(v & ((1 << 56) - 1)),
                link: (v >> 56) & 1 == 1,
            },
            _ => return None,
        })
    }
}

pub struct ReactorSettings {
    pub id: usize,
    /// Every reactor's pacer is built from these, over what they share
    /// (tenant clock, latency targets, pooled window, device op limit).
    pub pacers: Arc<PacerGroup>,
    pub max_requests: u32,
    pub drain_timeout: Duration,
    pub timeouts: Timeouts,
    pub poll: PollMode,
    pub poll_spin: Duration,
    /// How long a busy reactor waits to gather completions; zero: never.
    pub batch_wait: Duration,
    /// Which connections splice lent READ data instead of copying it.
    pub splice: SpliceMode,
    /// SO_SNDBUF for Unix-socket connections; 0: the kernel's default.
    pub unix_send_buffer: usize,
    /// SQ entries of the ring; 0: room for every request slot and more.
    pub ring_entries: u32,
}

/// A connection's socket, with its pipe while it splices.
struct Sock {
    conn: ConnId,
    fd: OwnedFd,
    /// Whether this connection's sends with lent data splice.
    splices: bool,
    /// Created on the first splicing send.
    pipe: Option<Pipe>,
    /// The bytes the send in flight put into the pipe: reported once the
    /// pipe is empty.
    pipe_send: usize,
}

pub struct Reactor {
    id: usize,
    ring: Ring,
    handle: Arc<ReactorHandle>,
    event_buf: Box<u64>,
    catalog: Arc<Catalog>,
    engine: Engine,
    /// Sockets by connection slot, with the connection they belong to.
    socks: Vec<Option<Sock>>,
    splice: SpliceMode,
    unix_send_buffer: usize,
    /// Memory the catalog's bdevs lend (address, length), sorted: only
    /// this is spliced by reference.
    lendable: Vec<(usize, usize)>,
    actions: Vec<Action>,
    /// Results of failed earlier SQEs of linked chains, until their tails complete.
    chain_errors: Vec<(IoToken, IoResult)>,
    origin: Instant,
    now: Nanos,
    poll: PollMode,
    poll_spin: Nanos,
    /// When the last completion arrived: `adaptive` polls until `poll_spin`
    /// after it.
    last_completion: Nanos,
    /// IOs submitted to a device through the ring and not yet completed.
    device_ios: u64,
    /// Mean time between device completions (EWMA, capped). While device
    /// IO is out and its completions come further apart than `poll_spin`
    /// (a disk at QD 1: one every 150 us or more), `adaptive` sleeps
    /// instead of spinning through the wait; when they come close together
    /// (a disk at QD 32), the spin still catches each without a wake-up.
    device_gap: Nanos,
    last_device_done: Nanos,
    /// Microseconds a busy reactor's wait gathers completions; zero when
    /// off or when the kernel cannot (no `IORING_FEAT_MIN_TIMEOUT`).
    batch_wait_us: u32,
    /// Requests the last loop turn served: the sign of a busy reactor.
    served: u64,
    /// Requests the last turn that served any served. A polling turn that
    /// finds nothing (or only receives) does not make a busy reactor
    /// lightly loaded: at QD 32 its sends still finish many at once.
    batch: u64,
    /// Bytes the last loop turn that completed receives received.
    received: usize,
    /// Whether gathering pays for this reactor's clients.
    gather: GatherTrial,
}

/// An idle stretch counts as this long a gap between device completions,
/// so after a pause a few close completions bring the spin back.
const DEVICE_GAP_CAP: Nanos = 1_000_000;

/// A loop turn that served this many requests makes the next wait gather:
/// one request at a time (QD 1) never waits longer than it must.
const BATCH_MIN_SERVED: u64 = 2;
/// A turn that received more than this carried payload: gathering would
/// let the clients' socket buffers fill and stall them, so it does not.
const BATCH_MAX_RECEIVED: usize = 4 << 10;
/// Completions a gathering wait asks for; its time limit usually ends it.
const BATCH_WANT: usize = 64;
/// `io_uring_enter(2)`'s flag to reap completions (and, with
/// `DEFER_TASKRUN`, to run the work that posts them); the io-uring crate
/// does not export it.
const IORING_ENTER_GETEVENTS: u32 = 1;

impl Reactor {
    pub fn new(
        settings: ReactorSettings,
        handle: Arc<ReactorHandle>,
        catalog: Arc<Catalog>,
        pool: Arc<SharedPool>,
        origin: Instant,
    ) -> io::Result<Reactor> {
        let entries = match settings.ring_entries {
            0 => (settings.max_requests + 1024)
                .next_power_of_two()
                .min(32768),
            n => n,
        };
        let ring = Ring::new(entries)?;
        let batch_wait_us = if ring.params().is_feature_min_timeout() {
            settings.batch_wait.as_micros().min(u128::from(u32::MAX)) as u32
        } else {
            0
        };
        let waker_handle = handle.clone();
        let bufs = pool.register_reactor(Box::new(move || waker_handle.wake()));
        let now = origin.elapsed().as_nanos() as Nanos;
        let pacer = settings.pacers.pacer(settings.id, now);
        let engine_settings = EngineSettings {
            id: settings.id,
            max_requests: settings.max_requests,
            drain_timeout: settings.drain_timeout.as_nanos() as Nanos,
            timeouts: settings.timeouts,
            payload_cap: PAYLOAD_CAP,
        };
        let engine = Engine::new(engine_settings, catalog.clone(), bufs, pacer, now);
        let mut lendable: Vec<(usize, usize)> = catalog
            .exports
            .iter()
            .filter_map(|e| e.bdev.lent_memory())
            .collect();
        lendable.sort_unstable();
        lendable.dedup();
        Ok(Reactor {
            id: settings.id,
            ring,
            handle,
            event_buf: Box::new(0),
            catalog,
            engine,
            socks: Vec::new(),
            splice: settings.splice,
            unix_send_buffer: settings.unix_send_buffer,
            lendable,
            actions: Vec::new(),
            chain_errors: Vec::new(),
            origin,
            now,
            poll: settings.poll,
            poll_spin: settings.poll_spin.as_nanos() as Nanos,
            last_completion: now,
            device_ios: 0,
            device_gap: 0,
            last_device_done: now,
            batch_wait_us,
            served: 0,
            batch: 0,
            received: 0,
            gather: GatherTrial::new(now),
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
            // Counted from here: a splicing send finishes while the actions
            // execute, not in a completion.
            let served_before = self.engine.ios_done();
            let now = self.clock();
            self.engine.tick(now);
            self.execute_actions();
            if self.engine.drained() {
                break;
            }
            self.ring.drain_backlog();
            self.submit_and_wait()?;
            self.engine.count_loop();
            cqes.clear();
            self.ring.completions(&mut cqes);
            self.clock();
            if !cqes.is_empty() {
                self.last_completion = self.now;
            }
            // What the latest receives brought; a turn with only sends
            // completing keeps the last one's.
            if cqes
                .iter()
                .any(|&(u, _)| matches!(Op::decode(u), Some(Op::Recv(_))))
            {
                self.received = 0;
            }
            for &(user_data, res) in &cqes {
                self.dispatch(user_data, res);
            }
            self.served = self.engine.ios_done() - served_before;
            if self.served > 0 {
                self.batch = self.served;
            }
            self.gather.on_turn(self.now, self.served);
        }
        Ok(())
    }

    /// Submits the queued SQEs and waits for a completion, the engine's next
    /// deadline or, polling, not at all. A reactor that served several
    /// requests last turn gathers: it sleeps up to `batch_wait_us` for more
    /// completions (the kernel's min-wait), so one wake-up, recv and send
    /// serve many requests.
    fn submit_and_wait(&mut self) -> io::Result<()> {
        let wait = self.wait_timeout();
        let timeout = wait.map(|ns| {
            types::Timespec::new()
                .sec(ns / 1_000_000_000)
                .nsec((ns % 1_000_000_000) as u32)
        });
        let batch_wait_us = if self.gather.gathering() {
            self.batch_wait_us
        } else {
            0
        };
        let gather = gather_wait(batch_wait_us, self.served, self.received, wait);
        // SQEs waiting for room: submit, reap and come back for them.
        if wait == Some(0) || self.ring.backlog_len() > 0 {
            return self.submit_and_peek();
        }
        let submitter = self.ring.submitter();
        let r = match (&timeout, gather) {
            (Some(ts), None) => {
                submitter.submit_with_args(1, &types::SubmitArgs::new().timespec(ts))
            }
            (None, None) => submitter.submit_and_wait(1),
            (Some(ts), Some(min_wait)) => {
                let args = types::SubmitArgs::new()
                    .timespec(ts)
                    .min_wait_usec(min_wait);
                submitter.submit_with_args(BATCH_WANT, &args)
            }
            (None, Some(min_wait)) => {
                let args = types::SubmitArgs::new().min_wait_usec(min_wait);
                submitter.submit_with_args(BATCH_WANT, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// A polling turn: submits and collects whatever completed, never
    /// waits. Asking for no completions skips the kernel's wait set-up (a
    /// timer armed and torn down): a zero timeout with one wanted cost
    /// most of a spinning reactor's CPU in `io_cqring_wait`, and every
    /// spin turn that costs less notices the next request sooner.
    fn submit_and_peek(&mut self) -> io::Result<()> {
        let to_submit = self.ring.queued() as u32;
        // SAFETY: no argument is passed; GETEVENTS with no completions
        // wanted only runs the ring's deferred work (which posts the
        // completions) and returns.
        let r = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                to_submit,
                0,
                IORING_ENTER_GETEVENTS,
                None,
            )
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => Ok(()),
                _ => Err(e),
            },
        }
    }

    fn polling(&self) -> bool {
        match self.poll {
            PollMode::Interrupt => false,
            // Only a lightly loaded reactor spins: its next request is one
            // client's next, which a sleep would delay by a wake-up. A busy
            // one gathers instead, and spinning would take the core its
            // clients need.
            PollMode::Adaptive => {
                (self.device_ios == 0 || self.device_gap < self.poll_spin)
                    && self.batch < BATCH_MIN_SERVED
                    && self.now < self.last_completion + self.poll_spin
            }
            PollMode::Busy => true,
        }
    }

    /// How long the next submit may wait: until the engine's next deadline,
    /// or not at all while polling.
    fn wait_timeout(&self) -> Option<Nanos> {
        if self.polling() {
            return Some(0);
        }
        Some(
            self.engine
                .next_deadline()?
                // A deadline already past waits the minimum (a clamp).
                .saturating_sub(self.now)
                .max(1_000),
        )
    }

    /// Queues one SQE, or a linked chain whole (into the ring's backlog
    /// when its submission queue is full).
    fn push_sqes(&mut self, sqes: &[squeue::Entry]) {
        // SAFETY: every SQE built here points at memory that lives until
        // its completion: the engine keeps connection buffers and request
        // buffers in place until it is told the operation ended.
        unsafe { self.ring.push(sqes) };
    }

    fn push_sqe(&mut self, sqe: squeue::Entry) {
        self.push_sqes(std::slice::from_ref(&sqe));
    }

    fn arm_eventfd(&mut self) {
        let ptr = (&mut *self.event_buf as *mut u64).cast::<u8>();
        let sqe = opcode::Read::new(types::Fd(self.handle.eventfd.as_raw_fd()), ptr, 8)
            .build()
            .user_data(Op::Event.encode());
        self.push_sqe(sqe);
    }

    /// Executes what the engine asked for; device IOs a memory bdev finishes
    /// at once are fed straight back, which may ask for more.
    fn execute_actions(&mut self) {
        loop {
            let mut actions = std::mem::take(&mut self.actions);
            self.engine.take_actions(&mut actions);
            if actions.is_empty() {
                self.actions = actions;
                return;
            }
            for action in actions.drain(..) {
                self.execute(action);
            }
            self.actions = actions;
            self.engine.flush();
        }
    }

    fn sock(&self, conn: ConnId) -> Option<i32> {
        match self.socks.get(conn.index as usize) {
            Some(Some(s)) if s.conn == conn => Some(s.fd.as_raw_fd()),
            _ => None,
        }
    }

    fn sock_mut(&mut self, conn: ConnId) -> Option<&mut Sock> {
        match self.socks.get_mut(conn.index as usize) {
            Some(Some(s)) if s.conn == conn => Some(s),
            _ => None,
        }
    }

    /// Sends `msg` through the connection's pipe if it splices and the
    /// message carries lent data worth it; false: send it as usual.
    fn try_splice_send(&mut self, conn: ConnId, msg: *const libc::msghdr) -> bool {
        let lendable = std::mem::take(&mut self.lendable);
        let done = self.splice_send(conn, msg, &lendable);
        self.lendable = lendable;
        done
    }

    fn splice_send(
        &mut self,
        conn: ConnId,
        msg: *const libc::msghdr,
        lendable: &[(usize, usize)],
    ) -> bool {
        let lent = |v: &libc::iovec| {
            let (p, n) = (v.iov_base as usize, v.iov_len);
            lendable.iter().any(|&(b, l)| p >= b && p + n <= b + l)
        };
        let id = self.id;
        let Some(sock) = self.sock_mut(conn) else {
            return false;
        };
        if !sock.splices {
            return false;
        }
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // the send is reported.
        let iovs = unsafe {
            let m = &*msg;
            std::slice::from_raw_parts(m.msg_iov, m.msg_iovlen)
        };
        if splice::ref_bytes(iovs, lent) == 0 {
            return false;
        }
        if sock.pipe.is_none() {
            match Pipe::new() {
                Ok(p) => sock.pipe = Some(p),
                Err(e) => {
                    tracing::warn!(reactor = id, "no pipe, sending by copy: {e}");
                    sock.splices = false;
                    return false;
                }
            }
        }
        let Some(pipe) = sock.pipe.as_mut() else {
            return false;
        };
        // SAFETY: the iovecs are readable (the engine's); `lent` accepts only
        // a bdev's mapping, whose pages may be referenced past the send.
        match unsafe { pipe.fill(iovs, lent) } {
            Ok(n) if n > 0 => sock.pipe_send = n,
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!(
                    reactor = id,
                    "filling the pipe failed, sending by copy: {e}"
                );
                return false;
            }
        }
        self.drain_pipe(conn);
        true
    }

    /// Splices the connection's pipe into its socket: reports the send to
    /// the engine once the pipe is empty (or failed), or waits for room.
    fn drain_pipe(&mut self, conn: ConnId) {
        let Some(sock) = self.sock_mut(conn) else {
            return;
        };
        let fd = sock.fd.as_raw_fd();
        let Some(pipe) = sock.pipe.as_mut() else {
            return;
        };
        let result = match pipe.drain_to(fd) {
            Ok(true) => Sent::Bytes(std::mem::take(&mut sock.pipe_send)),
            Ok(false) => {
                let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32)
                    .build()
                    .user_data(Op::Splice(conn).encode());
                self.push_sqe(sqe);
                return;
            }
            Err(e) => {
                // What is left in the pipe never goes: drop it (and its
                // page references) with the pipe.
                sock.pipe = None;
                sock.pipe_send = 0;
                Sent::Error(e.raw_os_error().unwrap_or(libc::EIO))
            }
        };
        self.engine.on_send(self.now, conn, result);
    }

    fn execute(&mut self, action: Action) {
        match action {
            Action::Recv { conn, buf, len } => {
                let Some(fd) = self.sock(conn) else { return };
                let sqe = opcode::Recv::new(types::Fd(fd), buf, len as u32)
                    .build()
                    .user_data(Op::Recv(conn).encode());
                self.push_sqe(sqe);
            }
            Action::Send { conn, msg } => {
                let Some(fd) = self.sock(conn) else { return };
                if self.try_splice_send(conn, msg) {
                    return;
                }
                let sqe = opcode::SendMsg::new(types::Fd(fd), msg)
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build()
                    .user_data(Op::Send(conn).encode());
                self.push_sqe(sqe);
            }
            Action::Submit { io, export, req } => self.submit(io, export, req),
            Action::Shutdown { conn, read_only } => {
                if let Some(fd) = self.sock(conn) {
                    let how = if read_only {
                        libc::SHUT_RD
                    } else {
                        libc::SHUT_RDWR
                    };
                    // SAFETY: shutting down our own socket; pending ops complete.
                    unsafe { libc::shutdown(fd, how) };
                }
            }
            Action::Close { conn } => {
                if self.sock(conn).is_some() {
                    self.socks[conn.index as usize] = None; // drops and closes the fd
                }
                self.conn_gone();
            }
        }
    }

    /// One connection fewer for the acceptor's count (it counted it in).
    fn conn_gone(&self) {
        let was = self.handle.conns.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(was > 0, "reactor {}: a connection left twice", self.id);
    }

    fn submit(&mut self, io: IoToken, export: u16, req: bdev::IoRequest) {
        let dev = self.catalog.exports[export as usize].bdev.clone();
        // A RAM export's written data goes out from where it lies: one copy
        // (into the socket) instead of two.
        if self.engine.try_lend(self.now, io, &dev, &req) {
            return;
        }
        // SAFETY: the iovecs point at pool buffers the request owns until the
        // engine hears the IO is done.
        match unsafe { dev.prepare(&req) } {
            Prep::Done(result) => self.engine.on_io_done(self.now, io, result),
            Prep::Sqes(sqes) => {
                self.device_ios += 1;
                let n = sqes.len();
                let chain: Vec<squeue::Entry> = (sqes.into_iter().enumerate())
                    .map(|(i, sqe)| {
                        let link = i + 1 < n;
                        sqe.user_data(Op::Io { io, link }.encode())
                    })
                    .collect();
                self.push_sqes(&chain);
            }
        }
    }

    fn dispatch(&mut self, user_data: u64, res: i32) {
        let now = self.now;
        match Op::decode(user_data) {
            Some(Op::Event) => {
                self.arm_eventfd();
                self.drain_inbox();
            }
            Some(Op::Recv(conn)) => {
                let result = match res {
                    r if r < 0 => Received::Error(-r),
                    0 => Received::Eof,
                    r => {
                        self.received += r as usize;
                        Received::Data(r as usize)
                    }
                };
                self.engine.on_recv(now, conn, result);
            }
            Some(Op::Send(conn)) => {
                let result = if res < 0 {
                    Sent::Error(-res)
                } else {
                    Sent::Bytes(res as usize)
                };
                self.engine.on_send(now, conn, result);
            }
            Some(Op::Splice(conn)) => {
                if res >= 0 {
                    // Room (or a hang-up, which the splice reports).
                    self.drain_pipe(conn);
                } else if let Some(sock) = self.sock_mut(conn) {
                    sock.pipe = None;
                    sock.pipe_send = 0;
                    self.engine.on_send(now, conn, Sent::Error(-res));
                }
            }
            Some(Op::Io { io, link }) => self.io_cqe(io, link, res),
            None => tracing::error!(reactor = self.id, user_data, "unknown completion"),
        }
    }

    fn io_cqe(&mut self, io: IoToken, link: bool, res: i32) {
        // Each IO's chain ends in exactly one completion without `link`.
        if !link {
            debug_assert!(
                self.device_ios > 0,
                "reactor {}: a device IO completed twice",
                self.id
            );
            self.device_ios -= 1;
            let gap = (self.now - self.last_device_done).min(DEVICE_GAP_CAP);
            self.device_gap = (self.device_gap * 7 + gap) / 8;
            self.last_device_done = self.now;
        }
        let Some((export, req)) = self.engine.io_request(io) else {
            return;
        };
        let dev = &self.catalog.exports[export as usize].bdev;
        if link {
            // Not the chain's last: only its first error matters.
            let result = dev.complete(&req, res);
            if result != IoResult::Ok && !self.chain_errors.iter().any(|(t, _)| *t == io) {
                self.chain_errors.push((io, result));
            }
            return;
        }
        let earlier = self.chain_errors.iter().position(|(t, _)| *t == io);
        let result = match earlier {
            Some(i) => self.chain_errors.swap_remove(i).1,
            None => dev.complete(&req, res),
        };
        self.engine.on_io_done(self.now, io, result);
    }

    fn drain_inbox(&mut self) {
        let msgs = match self.handle.inbox.lock() {
            Ok(mut inbox) => std::mem::take(&mut *inbox),
            Err(_) => return,
        };
        for msg in msgs {
            match msg {
                Msg::NewConn(fd, peer) => self.add_conn(fd, None, &peer),
                Msg::Resume(fd, hs, peer) => self.add_conn(fd, Some(hs), &peer),
                Msg::Stats(reply) => {
                    let mut snapshot = self.engine.snapshot(self.now);
                    snapshot.gathering = self.batch_wait_us > 0 && self.gather.gathering();
                    snapshot.sq_backlogged = self.ring.backlogged_total();
                    let _ = reply.send(snapshot);
                }
                Msg::Trace(q, reply) => {
                    let _ = reply.send(self.engine.trace(q, self.now));
                }
                Msg::SetPacing(cfg) => self.engine.set_pacing(cfg, self.now),
                Msg::Shutdown => self.engine.begin_drain(self.now),
            }
        }
    }

    fn add_conn(&mut self, fd: OwnedFd, handshake: Option<Box<proto::Handshake>>, peer: &str) {
        let Some(conn) = self.engine.accept(self.now, handshake) else {
            // Draining: dropping the fd closes it.
            self.conn_gone();
            return;
        };
        self.engine.set_peer(conn, peer);
        let i = conn.index as usize;
        if self.socks.len() <= i {
            self.socks.resize_with(i + 1, || None);
        }
        let unix = is_unix(&fd);
        let splices = match self.splice {
            SpliceMode::Off => false,
            SpliceMode::Unix => unix,
            SpliceMode::All => true,
        } && !self.lendable.is_empty();
        if unix && self.unix_send_buffer > 0 {
            set_send_buffer(&fd, self.unix_send_buffer);
        }
        // Splicing never blocks the reactor: a full socket fails it with
        // EAGAIN, and the reactor polls. (io_uring's own sends and receives
        // wait in the kernel whatever the flag.)
        if splices && !set_nonblocking(&fd) {
            tracing::warn!(reactor = self.id, "O_NONBLOCK failed: sending by copy");
        }
        let splices = splices && is_nonblocking(&fd);
        // A socket still here belongs to a closed connection whose Close is
        // not yet executed: dropping it closes it, and the Close skips it.
        self.socks[i] = Some(Sock {
            conn,
            fd,
            splices,
            pipe: None,
            pipe_send: 0,
        });
    }
}

/// How long, in microseconds, the next wait gathers completions, if at
/// all: only after a turn that served `served` requests and received no
/// payload (`received` bytes), only when the reactor may sleep (`wait` is
/// not zero), and never past the engine's deadline, which the kernel would
/// overshoot.
fn gather_wait(
    batch_wait_us: u32,
    served: u64,
    received: usize,
    wait: Option<Nanos>,
) -> Option<u32> {
    if batch_wait_us == 0 || served < BATCH_MIN_SERVED || received > BATCH_MAX_RECEIVED {
        return None;
    }
    match wait {
        Some(0) => None,
        Some(ns) => Some(u64::from(batch_wait_us).min((ns / 1_000).max(1)) as u32),
        None => Some(batch_wait_us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ReqId;

    #[test]
    fn only_a_busy_reactor_without_payload_gathers() {
        // One request a turn (QD 1) is answered at once.
        assert_eq!(gather_wait(20, 1, 28, None), None);
        assert_eq!(gather_wait(20, 8, 8 * 28, None), Some(20));
        // Streaming payload: the client's socket buffer must keep draining.
        assert_eq!(gather_wait(20, 8, 64 << 10, None), None);
        // Off, or polling (a zero wait).
        assert_eq!(gather_wait(0, 8, 0, None), None);
        assert_eq!(gather_wait(20, 8, 0, Some(0)), None);
        // A pacer deadline 5 us away caps it; a later one does not.
        assert_eq!(gather_wait(20, 8, 0, Some(5_500)), Some(5));
        assert_eq!(gather_wait(20, 8, 0, Some(1_000_000)), Some(20));
    }

    #[test]
    fn op_round_trips() {
        let conn = ConnId {
            index: u32::MAX,
            gen: crate::engine::GEN_MASK,
        };
        let ops = [
            Op::Event,
            Op::Recv(conn),
            Op::Send(ConnId { index: 3, gen: 1 }),
            Op::Splice(ConnId { index: 9, gen: 2 }),
            Op::Io {
                io: IoToken::whole(ReqId(u32::MAX)),
                link: false,
            },
            Op::Io {
                io: IoToken::piece(ReqId(7), crate::engine::MAX_PIECES),
                link: true,
            },
        ];
        for op in ops {
            assert_eq!(Op::decode(op.encode()), Some(op), "{op:?}");
        }
        assert_eq!(Op::decode(0), None);
    }
}
