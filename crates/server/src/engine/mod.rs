//! The request engine: one per reactor, sans-IO.
//!
//! It owns the connections, the request slots, the buffer-pool and pacer
//! calls, the emulated device delays and the statistics. A driver (the
//! io_uring reactor, or the simulator) feeds it events with the time they
//! happened at, and executes the [`Action`]s it returns: receive into memory
//! the engine owns, send iovecs, submit a device IO, shut down or close a
//! socket. Nothing in here knows a file descriptor or reads a clock.
//!
//! - `conn.rs`, `slot.rs`: connection and request-slot state (enums).
//! - `input.rs`: received bytes: handshake, request headers, WRITE payload.
//! - `request.rs`: the request state machine, [`Engine::advance`].
//! - `pieces.rs`: buffer-sized pieces of a WRITE payload or a streamed READ.
//! - `stream.rs`: large READs, piece by piece, and when a READ may start
//!   around them.
//! - `turns.rs`: `Turns`, a connection's READ turns (a stream runs alone).
//! - `output.rs`: replies and sends.
//! - `life.rs`: accepting, closing, timeouts, draining.
//! - `tls.rs`: STARTTLS: when the driver starts TLS, and what follows.
//! - `nvme.rs`: the NVMe/TCP front end (NBD's is `input.rs`, `slot.rs`'s
//!   reply encoding and the handshake in `proto`).
//! - `trace.rs`: the ring of the last request state changes, which
//!   `Engine::trace` reads for `iopace rpc trace`.

mod audit;
mod conn;
mod conns;
mod events;
mod ids;
mod input;
mod io;
mod life;
mod nbd;
mod nvme;
mod nvme_conn;
mod outbox;
mod output;
mod pieces;
mod request;
mod slot;
mod slots;
mod states;
mod trace;
mod turns;

use std::cmp::Reverse;
use std::sync::Arc;

use bdev::{IoRequest, IoResult};
use pace::pacer::{Pacer, PacingConfig};
use pace::Nanos;
use pool::ReactorBufs;

use crate::exports::Catalog;
use crate::stats::ReactorStats;
pub use conn::{Input, Life, RecvOp, SendOp};
use conns::Conns;
pub use events::{
    Action, EngineSettings, Opening, Received, Sent, Timeouts, TlsOutcome, PAYLOAD_CAP,
};
pub use ids::{ConnId, IoToken, Part, ReqId, GEN_MASK, MAX_PIECES};
use io::IoPath;
use nvme::NvmeFront;
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
        debug_assert!(
            now >= self.io.now,
            "time went back: {} -> {now}",
            self.io.now
        );
        self.io.now = now;
    }

    /// Moves the actions produced so far into `out` (which should be empty).
    pub fn take_actions(&mut self, out: &mut Vec<Action>) {
        std::mem::swap(&mut self.io.actions, out);
    }

    pub fn has_actions(&self) -> bool {
        !self.io.actions.is_empty()
    }

    /// Bytes received on `conn`'s posted recv.
    pub fn on_recv(&mut self, now: Nanos, conn: ConnId, result: Received) {
        self.set_now(now);
        self.recv_done(conn, result);
        self.settle();
    }

    /// `conn`'s TLS handshake (after [`Action::StartTls`]) ended.
    pub fn on_tls(&mut self, now: Nanos, conn: ConnId, outcome: TlsOutcome) {
        self.set_now(now);
        if let Some(c) = self.conns.get_mut(conn) {
            c.tls_done(outcome, &self.io.catalog.access);
            self.io.touched.push(conn);
        }
        self.settle();
    }

    /// `conn`'s posted send finished.
    pub fn on_send(&mut self, now: Nanos, conn: ConnId, result: Sent) {
        self.set_now(now);
        self.send_done(conn, result);
        self.settle();
    }

    /// The device finished `io`.
    pub fn on_io_done(&mut self, now: Nanos, io: IoToken, result: IoResult) {
        self.set_now(now);
        self.io_done(io, result);
        self.settle();
    }

    /// Serves `io` (submitted as `req` to `dev`) from the bdev's own memory
    /// if it lends it (`Bdev::lend_read`, `Slots::lend`): done now, nothing
    /// to submit. False: the driver submits it as usual.
    pub fn try_lend(&mut self, now: Nanos, io: IoToken, dev: &bdev::Bdev, req: &IoRequest) -> bool {
        let lent = dev.lend_read(req).is_some_and(|data| {
            // A data digest is computed before the send: it needs
            // bytes no WRITE changes in between (`nvme.rs`).
            !NvmeFront::digests_read_data(io.req, &mut self.conns, &self.slots)
                && self.slots.lend(io, data)
        });
        if lent {
            self.on_io_done(now, io, IoResult::Ok);
        }
        lent
    }

    /// The IO `io` as submitted, for the driver to interpret its completion.
    pub fn io_request(&self, io: IoToken) -> Option<(u16, IoRequest)> {
        self.slots.io_request(io, self.io.buf_size)
    }

    /// Time passes: buffer grants, delayed completions, the pacer, timeouts;
    /// then the sends this round produced.
    pub fn tick(&mut self, now: Nanos) {
        self.set_now(now);
        self.poll_grants();
        self.fire_delayed();
        self.poll_pacer();
        self.fire_conn_timers();
        if let Some(gone) = self.nvme.tick(&mut self.conns, &self.io) {
            for id in gone {
                if let Some(c) = self.conns.get_mut(id) {
                    c.ending(conn::EndReason::ControllerGone);
                }
                self.close(id);
            }
            self.settle();
        }
        self.check_drain();
        self.settle();
        self.flush();
        self.io
            .stats
            .sample_buffers(now, self.io.bufs.in_use(), self.io.bufs.in_use_bytes());
    }

    /// Posts the sends the events since the last flush made ready. Replies
    /// queued in one round go out in one sendmsg per connection.
    pub fn flush(&mut self) {
        while !self.conns.send_ready.is_empty() {
            let mut ready = std::mem::take(&mut self.conns.send_ready);
            for &conn in &ready {
                self.start_send(conn);
            }
            ready.clear();
            if self.conns.send_ready.is_empty() {
                self.conns.send_ready = ready; // keeps its capacity
            }
            self.settle();
        }
    }

    /// When the engine next needs a tick without any completion.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let candidates = [
            self.io.delayed.peek().map(|Reverse((t, _))| *t),
            self.io.pacer.next_wakeup(self.io.now),
            self.conns.timers.peek().map(|Reverse((t, _))| *t),
            self.nvme.deadline(),
            // Re-check the drain even when nothing completes.
            self.draining_since.map(|_| self.io.now + 50_000_000),
        ];
        candidates.into_iter().flatten().min()
    }

    pub fn set_pacing(&mut self, cfg: PacingConfig, now: Nanos) {
        self.set_now(now);
        tracing::info!(mode = ?cfg.mode, reactor = self.id, "pacing changed");
        self.io.pacer.reconfigure(cfg, now);
    }

    pub fn snapshot(&mut self, now: Nanos) -> ReactorStats {
        self.set_now(now);
        let pool = self.io.bufs.stats();
        let free = (self.io.pool.free_total(), u64::from(self.io.pool.total()));
        let mut snap = self
            .io
            .stats
            .snapshot(now, pool, free, self.io.delayed.len());
        snap.buffers.pool_bytes = self.io.pool.map_len() as u64;
        snap.pacer = self.io.pacer.stats(now);
        snap.nvme_connections = u64::from(self.nvme.open());
        snap
    }

    /// One more turn of the driver's loop (statistics).
    pub fn count_loop(&mut self) {
        self.io.stats.loops += 1;
    }

    /// Requests served (replies wholly sent) since the start.
    pub fn ios_done(&self) -> u64 {
        self.io.stats.ios_done()
    }

    /// Live connections.
    pub fn conns_open(&self) -> usize {
        self.conns.open()
    }

    pub fn buffers_in_use(&self) -> u64 {
        self.io.bufs.in_use()
    }

    /// Bytes of the buffers held by requests (small and large ones differ).
    pub fn buffer_bytes_in_use(&self) -> u64 {
        self.io.bufs.in_use_bytes()
    }

    /// The pacer, read-only: its estimates for a driver's own reports.
    pub fn pacer(&self) -> &Pacer {
        &self.io.pacer
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
        (self.io.stats.bytes_in, self.io.stats.bytes_out)
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
        Some((c.input, c.recv, c.send, c.life))
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod nvme_tests;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;
