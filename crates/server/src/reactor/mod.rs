//! One reactor per core: one io_uring for sockets and disks, its own
//! engine (connections, requests, buffer cache, pacer). The reactor is the
//! engine's io_uring driver: it executes the engine's actions as SQEs and
//! feeds completions back. One submit-and-wait per loop.

//!
//! Its parts: [`handle`] what other threads touch (inbox, eventfd),
//! [`op`] the tag of each SQE, [`socks`] the connections' sockets and
//! splicing sends, [`tls`] the TLS sessions of connections that STARTTLS,
//! [`wait`] how each turn waits (sleep, spin, gather).

mod handle;
mod op;
#[cfg(test)]
mod ring_tests;
mod socks;
mod tls;
mod wait;

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bdev::{IoResult, Prep};
use config::{PollMode, SpliceMode};
use io_uring::{opcode, squeue, types};
use pace::pacer::PacerGroup;
use pace::Nanos;
use pool::SharedPool;

pub use handle::{Accepted, Msg, ReactorHandle};
use op::Op;
pub use socks::SendBuffers;
use socks::{Drained, Socks};
use tls::{TlsConns, TlsOut};
use wait::Waiter;

use crate::engine::{
    Action, ConnId, Engine, EngineSettings, IoToken, Opening, Received, Sent, Timeouts, PAYLOAD_CAP,
};
use crate::exports::Catalog;
use crate::ring::Ring;

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
    /// The accepted sockets' send buffers and TCP_NOTSENT_LOWAT.
    pub send_buffers: SendBuffers,
    /// SQ entries of the ring; 0: room for every request slot and more.
    pub ring_entries: u32,
}

pub struct Reactor {
    id: usize,
    ring: Ring,
    handle: Arc<ReactorHandle>,
    event_buf: Box<u64>,
    catalog: Arc<Catalog>,
    engine: Engine,
    socks: Socks,
    tls: TlsConns,
    /// What `tls` asked for, executed by `run_tls`.
    tls_out: Vec<TlsOut>,
    actions: Vec<Action>,
    /// Results of failed earlier SQEs of linked chains, until their tails complete.
    chain_errors: Vec<(IoToken, IoResult)>,
    origin: Instant,
    now: Nanos,
    wait: Waiter,
}

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
        let batch_wait = if ring.params().is_feature_min_timeout() {
            settings.batch_wait
        } else {
            Duration::ZERO
        };
        let waker_handle = handle.clone();
        let bufs = pool.register_reactor(Box::new(move || waker_handle.wake()));
        if let Some(t) = &catalog.nvme {
            // Mail between engines (an Abort, an async event) wakes it.
            let h = handle.clone();
            t.register_waker(Box::new(move || h.wake()));
        }
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
            catalog: catalog.clone(),
            engine,
            socks: Socks::new(
                settings.id,
                settings.splice,
                settings.send_buffers,
                lendable,
            ),
            tls: TlsConns::new(settings.id, catalog.tls.clone()),
            tls_out: Vec::new(),
            actions: Vec::new(),
            chain_errors: Vec::new(),
            origin,
            now,
            wait: Waiter::new(settings.poll, settings.poll_spin, batch_wait, now),
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
            let engine = &self.engine;
            self.wait
                .submit_and_wait(&mut self.ring, self.now, || engine.next_deadline())?;
            self.engine.count_loop();
            cqes.clear();
            self.ring.completions(&mut cqes);
            let now = self.clock();
            let recvs = cqes
                .iter()
                .any(|&(u, _)| matches!(Op::decode(u), Some(Op::Recv(_) | Op::TlsRecv(_))));
            self.wait.on_completions(now, !cqes.is_empty(), recvs);
            for &(user_data, res) in &cqes {
                self.dispatch(user_data, res);
            }
            let served = self.engine.ios_done() - served_before;
            self.wait.on_turn(self.now, served);
        }
        Ok(())
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

    /// A splicing send is over (tell the engine) or waits for room (poll).
    fn on_drained(&mut self, conn: ConnId, drained: Drained) {
        match drained {
            Drained::Sent(result) => self.engine.on_send(self.now, conn, result),
            Drained::WaitRoom(fd) => {
                let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32)
                    .build()
                    .user_data(Op::Splice(conn).encode());
                self.push_sqe(sqe);
            }
        }
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

    fn execute(&mut self, action: Action) {
        match action {
            Action::Recv { conn, buf, len } => {
                if self.tls.recv(conn, buf, len, &mut self.tls_out) {
                    return self.run_tls();
                }
                let Some(fd) = self.socks.fd(conn) else {
                    return;
                };
                let sqe = opcode::Recv::new(types::Fd(fd), buf, len as u32)
                    .build()
                    .user_data(Op::Recv(conn).encode());
                self.push_sqe(sqe);
            }
            Action::Send { conn, msg } => {
                if self.tls.send(conn, msg, &mut self.tls_out) {
                    return self.run_tls();
                }
                let Some(fd) = self.socks.fd(conn) else {
                    return;
                };
                if let Some(drained) = self.socks.splice_send(conn, msg) {
                    self.on_drained(conn, drained);
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
                if !read_only {
                    self.tls.shutdown(conn);
                }
                if let Some(fd) = self.socks.fd(conn) {
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
                self.tls.close(conn);
                self.socks.close(conn);
                self.conn_gone();
            }
            Action::StartTls { conn } => {
                let fd = self.socks.fd(conn).unwrap_or(-1);
                self.socks.tls_started(conn);
                let peer = self.engine.peer(conn);
                self.tls.start(conn, fd, peer, &mut self.tls_out);
                self.run_tls();
            }
        }
    }

    /// Executes what the TLS sessions asked for: ciphertext SQEs, and the
    /// engine's events they answer.
    fn run_tls(&mut self) {
        let mut outs = std::mem::take(&mut self.tls_out);
        let now = self.now;
        for out in outs.drain(..) {
            match out {
                TlsOut::Recv { conn, fd, buf, len } => {
                    let sqe = opcode::Recv::new(types::Fd(fd), buf, len as u32)
                        .build()
                        .user_data(Op::TlsRecv(conn).encode());
                    self.push_sqe(sqe);
                }
                TlsOut::Send { conn, fd, buf, len } => {
                    let sqe = opcode::Send::new(types::Fd(fd), buf, len as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(Op::TlsSend(conn).encode());
                    self.push_sqe(sqe);
                }
                TlsOut::Tls(conn, outcome) => self.engine.on_tls(now, conn, outcome),
                TlsOut::Received(conn, result) => self.engine.on_recv(now, conn, result),
                TlsOut::Sent(conn, result) => self.engine.on_send(now, conn, result),
            }
        }
        self.tls_out = outs;
    }

    /// One connection fewer for the acceptor's count (it counted it in).
    fn conn_gone(&self) {
        let was = self.handle.conns.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(was > 0, "reactor {}: a connection left twice", self.id);
    }

    fn submit(&mut self, io: IoToken, export: u16, req: bdev::IoRequest) {
        // Borrowed, not cloned: an Arc's two atomic updates per IO.
        let dev = &self.catalog.exports[export as usize].bdev;
        // A RAM export's written data goes out from where it lies: one copy
        // (into the socket) instead of two.
        if self.engine.try_lend(self.now, io, dev, &req) {
            return;
        }
        // SAFETY: the iovecs point at pool buffers the request owns until the
        // engine hears the IO is done.
        match unsafe { dev.prepare(&req) } {
            Prep::Done(result) => self.engine.on_io_done(self.now, io, result),
            Prep::Sqes(sqes) => {
                self.wait.on_device_submit();
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
                        self.wait.on_received(r as usize);
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
                    if let Some(drained) = self.socks.drain_pipe(conn) {
                        self.on_drained(conn, drained);
                    }
                } else if self.socks.splice_failed(conn) {
                    self.engine.on_send(now, conn, Sent::Error(-res));
                }
            }
            Some(Op::Io { io, link }) => self.io_cqe(io, link, res),
            Some(Op::TlsRecv(conn)) => {
                if res > 0 {
                    self.wait.on_received(res as usize);
                }
                self.tls.recv_done(conn, res, &mut self.tls_out);
                self.run_tls();
            }
            Some(Op::TlsSend(conn)) => {
                self.tls.send_done(conn, res, &mut self.tls_out);
                self.run_tls();
            }
            None => tracing::error!(reactor = self.id, user_data, "unknown completion"),
        }
    }

    fn io_cqe(&mut self, io: IoToken, link: bool, res: i32) {
        // Each IO's chain ends in exactly one completion without `link`.
        if !link {
            self.wait.on_device_done(self.now);
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
                Msg::NewConn(a) => self.add_conn(a, Opening::Nbd(None)),
                Msg::NewNvme(a) => self.add_conn(a, Opening::Nvme),
                Msg::Resume(a, hs) => self.add_conn(a, Opening::Nbd(Some(hs))),
                Msg::Stats(reply) => {
                    let mut snapshot = self.engine.snapshot(self.now);
                    snapshot.gathering = self.wait.gathering();
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

    fn add_conn(&mut self, accepted: Accepted, opening: Opening) {
        let Some(conn) = self.engine.open(self.now, opening) else {
            // Draining: dropping the fd closes it.
            self.conn_gone();
            return;
        };
        self.engine.set_peer(conn, &accepted.peer, accepted.port);
        self.socks.add(conn, accepted.fd);
    }
}
