//! The request engine: one per reactor, sans-IO. A driver (the io_uring
//! reactor, or the simulator) feeds it events with the time they happened
//! at and carries out the [`Action`]s it returns; nothing here knows a file
//! descriptor or reads a clock. The engine composes components that own
//! their fields, and calls them with the parts they need:
//!
//! - `conns.rs` `Conns`: the connection table, send list and timeouts;
//!   `conn.rs` `Conn`: one connection (its state enums in `conn_state.rs`,
//!   receive buffer, `Outbox` send side in `outbox.rs`, READ `Turns` in
//!   `turns.rs`).
//! - `slots.rs` `Slots`: the request slots (`Req`, `slot.rs`, its reply's
//!   framing in `framing.rs`), free list and the connections waiting for a
//!   slot, their checked states (`states.rs`), trace ring (`trace.rs`) and
//!   device steps.
//! - `io_path.rs` `IoPath`: the clock, pacer, pool, devices, statistics, actions.
//! - `request.rs` `Requests`: the request machine ([`Requests::advance`],
//!   release, abort; the pacer's, the pool's and the devices' events;
//!   READ turns; replies sent; a connection's close, end of input and
//!   received bytes), a view over the slots, the connections and the IO
//!   path that owns no state; `pieces.rs` `Pieces`: a request's start,
//!   buffers, pieces and turns, whose follow-ups come back as a `Then`.
//! - The front ends, which drive the request machine: `nbd.rs`, NBD
//!   (handshake with STARTTLS, request headers, payloads, discards, over
//!   `Conn`'s own steps); `nvme.rs` `NvmeFront`, NVMe/TCP (its PDUs in,
//!   Connects, the target's mail and Aborts, controller checks), with
//!   `nvme_conn.rs` `NvmeConn` (one queue's state) and `nvme_data.rs`
//!   (what the request machine asks of an NVMe command: its data, its
//!   reply, its queue closed).
//! - Here, `Engine`, the only `impl Engine`: the driver's calls, the round
//!   that settles every connection an event touched, connections' lives
//!   (open, remove, timeouts, drain), and which front end reads a
//!   connection's bytes. `events.rs`: the driver's types; `audit.rs`: the
//!   books, each counted twice.
//!
//! Files layer: `Engine` (here) over the front ends (`nbd.rs`, `nvme.rs`)
//! over the request machine (`request.rs`, `pieces.rs`, `nvme_data.rs`)
//! over the parts (`slots.rs`, `conns.rs`, `conn.rs`, `io_path.rs`); no file
//! calls up.

/// Read-only accessors, one per field: by value, or as a slice. The
/// engine's components use it for the fields the other parts only read.
macro_rules! readers {
    ($($f:ident: $t:ty),* ; $($v:ident: [$e:ty]),*) => {
        $(pub fn $f(&self) -> $t { self.$f })*
        $(pub fn $v(&self) -> &[$e] { &self.$v })*
    };
}

mod audit;
mod conn;
mod conn_state;
mod conns;
mod events;
mod framing;
mod ids;
mod io_path;
mod nbd;
mod nvme;
mod nvme_conn;
mod nvme_data;
mod outbox;
mod pieces;
mod request;
mod slot;
mod slots;
mod states;
mod trace;
mod turns;

use std::sync::Arc;

use bdev::{IoRequest, IoResult};
use pace::pacer::{Pacer, PacingConfig};
use pace::Nanos;
use pool::ReactorBufs;
use proto::Handshake;

use crate::exports::Catalog;
use crate::stats::ReactorStats;
use conn_state::{EndReason, Phase, Step};
pub use conn_state::{Input, Life, RecvOp, SendOp};
use conns::Conns;
pub use events::{
    Action, EngineSettings, Opening, Received, Sent, Timeouts, TlsOutcome, PAYLOAD_CAP,
};
pub use ids::{ConnId, IoToken, Part, ReqId, GEN_MASK, MAX_PIECES};
use io_path::IoPath;
use nvme::NvmeFront;
use nvme_conn::NvmeConn;
use request::Requests;
use slots::Slots;
pub use states::{PieceState, ReqStage};
pub use trace::{TraceQuery, TracedReq, TracedState};

pub struct Engine {
    id: usize,
    /// The clock, pacer, pool, devices, statistics and the driver's actions.
    io: IoPath,
    /// The connections, their send list and their timeouts.
    conns: Conns,
    /// The request slots, and the ring of their last state changes.
    slots: Slots,
    /// Scratch list of requests whose replies a send finished.
    sent: Vec<ReqId>,
    timeouts: Timeouts,
    drain_timeout: Nanos,
    draining_since: Option<Nanos>,
    /// Buffers one connection's requests may commit before it stops parsing.
    conn_cap: u32,
    /// The NVMe/TCP front end: its connections' count and controller checks.
    nvme: NvmeFront,
}

impl Engine {
    pub fn new(
        settings: EngineSettings,
        catalog: Arc<Catalog>,
        bufs: ReactorBufs,
        pacer: Pacer,
        now: Nanos,
    ) -> Engine {
        let conn_cap = (bufs.pool().large_buffers() / 4).max(settings.payload_cap);
        let io = IoPath::new(settings.id, catalog, bufs, pacer, settings.payload_cap, now);
        Engine {
            id: settings.id,
            io,
            conn_cap,
            conns: Conns::new(),
            slots: Slots::new(settings.max_requests),
            sent: Vec::new(),
            timeouts: settings.timeouts,
            drain_timeout: settings.drain_timeout,
            draining_since: None,
            nvme: NvmeFront::new(settings.id),
        }
    }

    /// The driver's clock at an event. It never goes back, so the engine's
    /// time differences are exact.
    fn set_now(&mut self, now: Nanos) {
        self.io.set_now(now);
    }

    /// Moves the actions produced so far into `out` (which should be empty).
    pub fn take_actions(&mut self, out: &mut Vec<Action>) {
        self.io.take_actions(out);
    }

    /// Bytes received on `conn`'s posted recv.
    pub fn on_recv(&mut self, now: Nanos, conn: ConnId, result: Received) {
        self.set_now(now);
        self.requests().received(conn, result);
        self.settle();
    }

    /// `conn`'s TLS handshake (after [`Action::StartTls`]) ended.
    pub fn on_tls(&mut self, now: Nanos, conn: ConnId, outcome: TlsOutcome) {
        self.set_now(now);
        if let Some(c) = self.conns.get_mut(conn) {
            c.tls_done(outcome, &self.io.catalog().access);
            self.io.touch(conn);
        }
        self.settle();
    }

    /// `conn`'s posted send finished.
    pub fn on_send(&mut self, now: Nanos, conn: ConnId, result: Sent) {
        self.set_now(now);
        self.requests().send_done(conn, result);
        self.settle();
    }

    /// The device finished `io`.
    pub fn on_io_done(&mut self, now: Nanos, io: IoToken, result: IoResult) {
        self.set_now(now);
        self.requests().io_done(io, result);
        self.settle();
    }

    /// Serves `io` (submitted as `req` to `dev`) from the bdev's own memory
    /// if it lends it (`Bdev::lend_read`, `Slots::lend`): done now, nothing
    /// to submit. False: the driver submits it as usual.
    pub fn try_lend(&mut self, now: Nanos, io: IoToken, dev: &bdev::Bdev, req: &IoRequest) -> bool {
        let lent = dev.lend_read(req).is_some_and(|data| {
            // A data digest is computed before the send: it needs
            // bytes no WRITE changes in between (`nvme.rs`).
            !nvme_data::digests_read_data(io.req, &mut self.conns, &self.slots)
                && self.slots.lend(io, data)
        });
        if lent {
            self.on_io_done(now, io, IoResult::Ok);
        }
        lent
    }

    /// The IO `io` as submitted, for the driver to interpret its completion.
    pub fn io_request(&self, io: IoToken) -> Option<(u16, IoRequest)> {
        self.slots.io_request(io, self.io.buf_size())
    }

    /// Time passes: buffer grants, delayed completions, the pacer, timeouts;
    /// then the sends this round produced.
    pub fn tick(&mut self, now: Nanos) {
        self.set_now(now);
        self.requests().poll_grants();
        self.requests().fire_delayed();
        self.requests().poll_pacer();
        self.fire_conn_timers();
        self.nvme_tick();
        self.check_drain();
        self.settle();
        self.flush();
        let (in_use, bytes) = (self.io.bufs().in_use(), self.io.bufs().in_use_bytes());
        self.io.stats_mut().sample_buffers(now, in_use, bytes);
    }

    /// Posts the sends the events since the last flush made ready. Replies
    /// queued in one round go out in one sendmsg per connection.
    pub fn flush(&mut self) {
        while (self.conns).send_round(self.slots.reqs(), &mut self.io) {
            self.settle();
        }
    }

    /// When the engine next needs a tick without any completion.
    pub fn next_deadline(&self) -> Option<Nanos> {
        // The earliest of these, folded by hand: it runs after every event.
        let earlier = |a: Option<Nanos>, b: Option<Nanos>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            _ => a.or(b),
        };
        let mut t = self.io.next_held();
        t = earlier(t, self.io.pacer().next_wakeup(self.io.now()));
        t = earlier(t, self.conns.next_timer());
        t = earlier(t, self.nvme.deadline());
        // Re-check the drain even when nothing completes.
        earlier(t, self.draining_since.map(|_| self.io.now() + 50_000_000))
    }

    pub fn set_pacing(&mut self, cfg: PacingConfig, now: Nanos) {
        self.set_now(now);
        tracing::info!(mode = ?cfg.mode, reactor = self.id, "pacing changed");
        self.io.pacer_mut().reconfigure(cfg, now);
    }

    pub fn snapshot(&mut self, now: Nanos) -> ReactorStats {
        self.set_now(now);
        let pool = self.io.bufs().stats();
        let free = (
            self.io.pool().free_total(),
            u64::from(self.io.pool().total()),
        );
        let held = self.io.held();
        let mut snap = self.io.stats_mut().snapshot(now, pool, free, held);
        snap.buffers.pool_bytes = self.io.pool().map_len() as u64;
        snap.pacer = self.io.pacer().stats(now);
        snap.nvme_connections = u64::from(self.nvme.open());
        snap
    }

    /// One more turn of the driver's loop (statistics).
    pub fn count_loop(&mut self) {
        self.io.stats_mut().loops += 1;
    }

    /// Requests served (replies wholly sent) since the start.
    pub fn ios_done(&self) -> u64 {
        self.io.stats().ios_done()
    }

    /// Live connections.
    pub fn conns_open(&self) -> usize {
        self.conns.open()
    }

    pub fn buffers_in_use(&self) -> u64 {
        self.io.bufs().in_use()
    }

    /// Bytes of the buffers held by requests (small and large ones differ).
    pub fn buffer_bytes_in_use(&self) -> u64 {
        self.io.bufs().in_use_bytes()
    }

    /// The pacer, read-only: its estimates for a driver's own reports.
    pub fn pacer(&self) -> &Pacer {
        self.io.pacer()
    }

    /// Checks every book of the engine against its second count
    /// (`audit.rs`); the first that does not balance is returned, named.
    pub fn audit(&self) -> Result<(), String> {
        let (slots, conns, io) = (&self.slots, &self.conns, &self.io);
        audit::Books { slots, conns, io }.check()
    }

    /// Bytes received and sent since the start, as counted: a driver
    /// checks them against what it moved.
    pub fn bytes_moved(&self) -> (u64, u64) {
        (self.io.stats().bytes_in, self.io.stats().bytes_out)
    }

    pub fn requests_in_use(&self) -> usize {
        self.slots.in_use()
    }

    /// The requests in flight that `q` names, oldest first, with their
    /// states (`iopace rpc trace`).
    pub fn trace(&self, q: TraceQuery, now: Nanos) -> Vec<TracedReq> {
        self.slots.trace(q, now, self.id, &self.conns)
    }

    pub fn conn_state(&self, conn: ConnId) -> Option<(Input, RecvOp, SendOp, Life)> {
        let c = self.conns.get(conn)?;
        Some((c.input(), c.recv(), c.send(), c.life()))
    }
}

/// Connections' lives: accepted, serving, closing, closed; their
/// timeouts; and the engine's drain at shutdown.
impl Engine {
    /// A new connection. `handshake` is one already under way (a connection
    /// handed over mid-negotiation); None starts a fresh one. None back means
    /// the engine is draining: the driver closes the socket.
    pub fn accept(&mut self, now: Nanos, handshake: Option<Box<Handshake>>) -> Option<ConnId> {
        self.open(now, Opening::Nbd(handshake))
    }

    /// A new connection of either protocol; None: the engine is draining.
    pub fn open(&mut self, now: Nanos, opening: Opening) -> Option<ConnId> {
        self.set_now(now);
        if self.draining_since.is_some() {
            return None;
        }
        let phase = match opening {
            Opening::Nbd(handshake) => Phase::Handshake(
                handshake.unwrap_or_else(|| Box::new(self.io.catalog().handshake())),
            ),
            Opening::Nvme => {
                self.nvme.count(true, self.io.now());
                Phase::Nvme(Box::new(NvmeConn::new(self.io.catalog())))
            }
        };
        let id = self.conns.insert(phase, now);
        self.io.stats_mut().conns_total += 1;
        self.io.stats_mut().conns_now += 1;
        self.conns.mark_send(id);
        self.io.touch(id);
        self.settle();
        Some(id)
    }

    /// Brings every connection an event touched up to date: parses what it
    /// has buffered, posts its next recv, closes it when it is done, and
    /// frees it once nothing is in flight. The pacer is polled between
    /// rounds, so what it releases is served in the same event.
    fn settle(&mut self) {
        loop {
            while let Some(id) = self.io.next_touched() {
                self.settle_conn(id);
            }
            if !self.requests().poll_pacer() && self.io.all_settled() {
                return;
            }
        }
    }

    fn settle_conn(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(id) else { return };
        if c.life() == Life::Closing {
            if c.quiet() {
                self.remove_conn(id);
            }
            return;
        }
        if let Input::Payload(r) = c.input() {
            self.requests().piece_ops().start_pieces(r);
        }
        self.process_input(id);
        // NVMe/TCP: waiting commands start, and what the queue wrote goes out.
        NvmeFront::start_waiting(id, self.conn_cap, &mut self.requests());
        NvmeFront::flush(id, &mut self.conns);
        match self.conns.get(id) {
            Some(c) if c.life() == Life::Open && c.finished() => self.close(id),
            Some(c) if c.life() == Life::Open => {
                self.post_recv(id);
                self.conns.arm_timer(id, &self.timeouts);
            }
            _ => {}
        }
    }

    /// Shuts the socket down and releases everything not in the kernel's or
    /// the device's hands; the rest is released as it completes.
    fn close(&mut self, id: ConnId) {
        self.requests().close(id);
    }

    fn remove_conn(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(id) else { return };
        c.log_closed(self.io.catalog(), self.id, self.io.now());
        if matches!(c.phase(), Phase::Nvme(_)) {
            self.nvme.count(false, self.io.now());
        }
        // Its paced IOs were cancelled or completed before it went quiet.
        self.io.pacer_mut().close_flow(c.flow());
        self.conns.remove(id);
        debug_assert!(self.io.stats().conns_now > 0);
        self.io.stats_mut().conns_now -= 1;
        self.io.act(Action::Close { conn: id });
    }

    /// The client of a connection, as [`Engine::set_peer`] named it.
    pub fn peer(&self, id: ConnId) -> &str {
        self.conns.get(id).map_or("", |c| c.peer())
    }

    /// Names the client of a connection just accepted, for its logs, and
    /// tells the pacer its host: connections from one address share that
    /// host's link (a Unix client is a host of its own); and the target
    /// port it came in on, if the pacers measure ports (`PortLoad`).
    pub fn set_peer(&mut self, id: ConnId, peer: &str, port: Option<usize>) {
        if let Some(c) = self.conns.get_mut(id) {
            if let Some(host) = c.set_peer(peer) {
                self.io.pacer_mut().open_flow(c.flow(), host);
            }
            port.inspect(|&p| self.io.pacer_mut().flow_port(c.flow(), p));
        }
    }

    /// Closes connections whose deadline has passed.
    fn fire_conn_timers(&mut self) {
        while let Some(id) = self.conns.next_timed_out(self.io.now(), &self.timeouts) {
            let Some(c) = self.conns.get_mut(id) else {
                continue;
            };
            tracing::info!(reactor = self.id, conn = id.index, input = ?c.input(), "connection timed out");
            self.io.stats_mut().timeouts += 1;
            c.ending(EndReason::Timeout);
            self.close(id);
        }
        self.settle();
    }

    /// Stops taking input everywhere; requests in flight still get answers.
    pub fn begin_drain(&mut self, now: Nanos) {
        self.set_now(now);
        if self.draining_since.is_some() {
            return;
        }
        self.draining_since = Some(now);
        for id in self.conns.ids() {
            let Some(c) = self.conns.get_mut(id) else {
                continue;
            };
            if c.life() != Life::Open {
                continue;
            }
            c.ending(EndReason::Draining);
            self.io.act(Action::Shutdown {
                conn: id,
                read_only: true,
            });
            if matches!(c.input(), Input::Payload(_) | Input::Discard(_)) {
                // A half-received WRITE can never finish.
                self.close(id);
            } else {
                self.requests().input_ended(id);
            }
        }
        self.settle();
    }

    /// At the drain timeout, closes what is still open.
    fn check_drain(&mut self) {
        let Some(since) = self.draining_since else {
            return;
        };
        if self.io.now() - since <= self.drain_timeout {
            return;
        }
        for id in self.conns.ids() {
            if let Some(c) = self.conns.get_mut(id) {
                if c.life() == Life::Open {
                    tracing::warn!(
                        reactor = self.id,
                        conn = id.index,
                        "drain timed out; closing"
                    );
                    c.drain_timed_out();
                    self.close(id);
                }
            }
        }
    }

    /// True once draining and every connection is gone (or twice the drain
    /// timeout has passed: closed sockets complete their operations promptly).
    pub fn drained(&self) -> bool {
        let Some(since) = self.draining_since else {
            return false;
        };
        self.conns.open() == 0 || self.io.now() - since > 2 * self.drain_timeout
    }
}

/// Received bytes, by what the connection's input is (the NBD front end's
/// steps in `nbd.rs`, NVMe/TCP's in `nvme.rs`), and the recv that brings
/// the next ones; the NVMe/TCP front end's timers and mail.
impl Engine {
    /// The request machine over the engine's parts (`request.rs`).
    fn requests(&mut self) -> Requests<'_> {
        self.nvme_parts().1
    }

    /// The NVMe/TCP front end, beside the request machine it drives.
    fn nvme_parts(&mut self) -> (&mut NvmeFront, Requests<'_>) {
        let r = Requests::new(
            &mut self.slots,
            &mut self.conns,
            &mut self.io,
            &mut self.sent,
        );
        (&mut self.nvme, r)
    }

    /// Consumes buffered input as far as it goes.
    fn process_input(&mut self, id: ConnId) {
        let cap = self.conn_cap;
        loop {
            let Some(c) = self.conns.get(id) else { return };
            if c.life() != Life::Open {
                return;
            }
            let input = c.input();
            let (nvme, mut r) = self.nvme_parts();
            let step = match input {
                Input::Handshake => nbd::handshake_input(&mut r, id),
                Input::StartTls => nbd::start_tls(&mut r, id),
                Input::Headers => nbd::header_input(&mut r, id, cap),
                Input::Payload(req) => nbd::payload_input(&mut r, id, req),
                Input::Discard(left) => r.conn(id).map_or(Step::Stop, |c| c.discard_input(left)),
                Input::Pdus => nvme.input(id, cap, &mut r),
                Input::WaitSlot | Input::Ended => Step::Stop,
            };
            if let Step::Stop = step {
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(id) {
            c.compact();
        }
    }

    /// Posts the connection's next recv if its input can take bytes: into
    /// the receive buffer, or straight into a WRITE piece's buffer.
    fn post_recv(&mut self, id: ConnId) {
        let (bs, cap) = (self.io.buf_size(), self.conn_cap);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if let Some((buf, len)) = c.next_recv(self.slots.reqs(), bs, cap) {
            self.io.act(Action::Recv { conn: id, buf, len });
        }
    }

    /// Every 100 ms: the controllers' keep-alive timers run, and queues
    /// whose controller (or IO queue) is gone close. Mail from the target
    /// is taken at once.
    fn nvme_tick(&mut self) {
        // An Abort's answer is mail too: an Abort whose queues are both
        // here completes in this tick.
        for _ in 0..3 {
            let (nvme, mut r) = self.nvme_parts();
            if !nvme.mail(&mut r) {
                break;
            }
            self.settle();
        }
        let (nvme, mut r) = self.nvme_parts();
        if nvme.check(&mut r) {
            self.settle();
        }
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod nvme_abort_tests;
#[cfg(test)]
mod nvme_tests;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;
