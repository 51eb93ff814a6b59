//! Connections' lives: accepted, serving, closing, closed; their timeouts;
//! and the engine's drain at shutdown.

use pace::Nanos;
use proto::Handshake;

use super::conn::{EndReason, Input, Life, Phase};
use super::ids::{ConnId, ReqId};
use super::nvme::NvmeFront;
use super::nvme_conn::NvmeConn;
use super::states::ReqStage;
use super::{Action, Engine, Opening};

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
            Opening::Nbd(handshake) => {
                Phase::Handshake(handshake.unwrap_or_else(|| Box::new(self.io.catalog.handshake())))
            }
            Opening::Nvme => {
                self.nvme.count(true, self.io.now);
                Phase::Nvme(Box::new(NvmeConn::new(&self.io.catalog)))
            }
        };
        let id = self.conns.insert(phase, now);
        self.io.stats.conns_total += 1;
        self.io.stats.conns_now += 1;
        self.conns.mark_send(id);
        self.io.touched.push(id);
        self.settle();
        Some(id)
    }

    /// Brings every connection an event touched up to date: parses what it
    /// has buffered, posts its next recv, closes it when it is done, and
    /// frees it once nothing is in flight. The pacer is polled between
    /// rounds, so what it releases is served in the same event.
    pub(super) fn settle(&mut self) {
        loop {
            while let Some(id) = self.io.touched.pop() {
                self.settle_conn(id);
            }
            if !self.poll_pacer() && self.io.touched.is_empty() {
                return;
            }
        }
    }

    fn settle_conn(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(id) else { return };
        if c.life == Life::Closing {
            if c.quiet() {
                self.remove_conn(id);
            }
            return;
        }
        if let Input::Payload(r) = c.input {
            (self.slots).start_pieces(r, &mut self.conns, &mut self.io);
        }
        self.process_input(id);
        // NVMe/TCP: waiting commands start, and what the queue wrote goes out.
        self.nvme_start_waiting(id);
        NvmeFront::flush(id, &mut self.conns);
        match self.conns.get(id) {
            Some(c) if c.life == Life::Open && c.finished() => self.close(id),
            Some(c) if c.life == Life::Open => {
                self.post_recv(id);
                self.conns.arm_timer(id, &self.timeouts);
            }
            _ => {}
        }
    }

    /// Shuts the socket down and releases everything not in the kernel's or
    /// the device's hands; the rest is released as it completes.
    pub(super) fn close(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.life == Life::Closing {
            return;
        }
        let (input, sending) = c.close();
        self.io.actions.push(Action::Shutdown {
            conn: id,
            read_only: false,
        });
        if input == Input::WaitSlot {
            self.slots.waiters.retain(|&w| w != id);
        }
        if !sending {
            self.drop_replies(id);
        }
        for i in 0..self.slots.reqs.len() as u32 {
            let req = &self.slots.reqs[i as usize];
            if req.conn == id && req.state != ReqStage::Free {
                self.abort(ReqId(i));
            }
        }
        NvmeFront::closed(id, &mut self.conns, &mut self.slots, &self.io);
        self.io.touched.push(id);
    }

    fn remove_conn(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(id) else { return };
        debug_assert!(c.quiet(), "{id:?} freed with operations in flight");
        debug_assert_eq!(c.committed, 0, "{id:?} freed holding buffer commitments");
        debug_assert_eq!(c.payload_pieces, 0, "{id:?} freed holding payload pieces");
        debug_assert!(c.out.replies.is_empty(), "{id:?} freed with replies queued");
        c.log_closed(&self.io.catalog, self.id, self.io.now);
        if matches!(c.phase, Phase::Nvme(_)) {
            self.nvme.count(false, self.io.now);
        }
        let Some(c) = self.conns.get(id) else { return };
        // Its paced IOs were cancelled or completed before it went quiet.
        self.io.pacer.close_flow(c.flow);
        self.conns.remove(id);
        debug_assert!(self.io.stats.conns_now > 0);
        self.io.stats.conns_now -= 1;
        self.io.actions.push(Action::Close { conn: id });
    }

    /// The client of a connection, as [`Engine::set_peer`] named it.
    pub fn peer(&self, id: ConnId) -> &str {
        self.conns.get(id).map_or("", |c| &c.peer)
    }

    /// Names the client of a connection just accepted, for its logs, and
    /// tells the pacer its host: connections from one address share that
    /// host's link (a Unix client is a host of its own).
    pub fn set_peer(&mut self, id: ConnId, peer: &str) {
        if let Some(c) = self.conns.get_mut(id) {
            if let Some(host) = c.set_peer(peer) {
                self.io.pacer.open_flow(c.flow, host);
            }
        }
    }

    /// Closes connections whose deadline has passed.
    pub(super) fn fire_conn_timers(&mut self) {
        while let Some(id) = self.conns.next_timed_out(self.io.now, &self.timeouts) {
            let Some(c) = self.conns.get_mut(id) else {
                continue;
            };
            tracing::info!(reactor = self.id, conn = id.index, input = ?c.input, "connection timed out");
            self.io.stats.timeouts += 1;
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
            if c.life != Life::Open {
                continue;
            }
            c.ending(EndReason::Draining);
            self.io.actions.push(Action::Shutdown {
                conn: id,
                read_only: true,
            });
            if matches!(c.input, Input::Payload(_) | Input::Discard(_)) {
                // A half-received WRITE can never finish.
                self.close(id);
            } else {
                self.input_ended(id);
            }
        }
        self.settle();
    }

    /// At the drain timeout, closes what is still open.
    pub(super) fn check_drain(&mut self) {
        let Some(since) = self.draining_since else {
            return;
        };
        if self.io.now - since <= self.drain_timeout {
            return;
        }
        for id in self.conns.ids() {
            if let Some(c) = self.conns.get_mut(id) {
                if c.life == Life::Open {
                    tracing::warn!(
                        reactor = self.id,
                        conn = id.index,
                        "drain timed out; closing"
                    );
                    c.end = Some(EndReason::DrainTimeout);
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
        self.conns.open() == 0 || self.io.now - since > 2 * self.drain_timeout
    }
}
