//! Connections' lives: accepted, serving, closing, closed; their timeouts;
//! and the engine's drain at shutdown.

use std::cmp::Reverse;

use pace::Nanos;
use proto::Handshake;

use super::conn::{Conn, EndReason, Input, Life, Phase, SendOp};
use super::ids::{ConnId, ReqId, GEN_MASK};
use super::nvme_conn::NvmeConn;
use super::slot::ReqStage;
use super::{conn_at, Action, Engine, Opening};

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
                self.nvme_count(true);
                Phase::Nvme(Box::new(NvmeConn::new(&self.io.catalog)))
            }
        };
        let index = self.free_conns.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conn_gens.push(0);
            (self.conns.len() - 1) as u32
        });
        let gen = self.conn_gens[index as usize].wrapping_add(1) & GEN_MASK;
        self.conn_gens[index as usize] = gen;
        let id = ConnId { index, gen };
        let mut conn = Box::new(Conn::new(id, self.next_flow, phase, now));
        self.next_flow += 1;
        if let Phase::Handshake(h) = &mut conn.phase {
            conn.raw_out = h.take_output();
        }
        self.conns[index as usize] = Some(conn);
        self.io.stats.conns_total += 1;
        self.io.stats.conns_now += 1;
        self.mark_send(id);
        self.touched.push(id);
        self.settle();
        Some(id)
    }

    /// Brings every connection an event touched up to date: parses what it
    /// has buffered, posts its next recv, closes it when it is done, and
    /// frees it once nothing is in flight. The pacer is polled between
    /// rounds, so what it releases is served in the same event.
    pub(super) fn settle(&mut self) {
        loop {
            while let Some(id) = self.touched.pop() {
                self.settle_conn(id);
            }
            if !self.poll_pacer() && self.touched.is_empty() {
                return;
            }
        }
    }

    fn settle_conn(&mut self, id: ConnId) {
        let Some(c) = self.conn_ref(id) else { return };
        if c.life == Life::Closing {
            if c.quiet() {
                self.remove_conn(id);
            }
            return;
        }
        if let Input::Payload(r) = c.input {
            self.start_pieces(r);
        }
        self.process_input(id);
        self.nvme_settle(id);
        match self.conn_ref(id) {
            Some(c) if c.life == Life::Open && c.finished() => self.close(id),
            Some(c) if c.life == Life::Open => {
                self.post_recv(id);
                self.arm_timer(id);
            }
            _ => {}
        }
    }

    /// Shuts the socket down and releases everything not in the kernel's or
    /// the device's hands; the rest is released as it completes.
    pub(super) fn close(&mut self, id: ConnId) {
        let Some(c) = conn_at(&mut self.conns, id) else {
            return;
        };
        if c.life == Life::Closing {
            return;
        }
        c.set_closing();
        let input = c.set_input(Input::Ended);
        let sending = c.send == SendOp::InFlight;
        if c.send == SendOp::Ready {
            c.set_send(SendOp::Idle);
        }
        self.io.actions.push(Action::Shutdown {
            conn: id,
            read_only: false,
        });
        if input == Input::WaitSlot {
            self.slot_waiters.retain(|&w| w != id);
        }
        if !sending {
            self.drop_replies(id);
        }
        for i in 0..self.reqs.len() as u32 {
            let req = &self.reqs[i as usize];
            if req.conn == id && req.state != ReqStage::Free {
                self.abort(ReqId(i));
            }
        }
        self.nvme_closed(id);
        self.touched.push(id);
    }

    fn remove_conn(&mut self, id: ConnId) {
        let Some(c) = self.conn_ref(id) else { return };
        debug_assert!(c.quiet(), "{id:?} freed with operations in flight");
        debug_assert_eq!(c.committed, 0, "{id:?} freed holding buffer commitments");
        debug_assert_eq!(c.payload_pieces, 0, "{id:?} freed holding payload pieces");
        debug_assert!(c.out.is_empty(), "{id:?} freed with replies queued");
        self.log_closed(c);
        if matches!(c.phase, Phase::Nvme(_)) {
            self.nvme_count(false);
        }
        let Some(c) = self.conn_ref(id) else { return };
        // Its paced IOs were cancelled or completed before it went quiet.
        self.io.pacer.close_flow(c.flow);
        self.conns[id.index as usize] = None;
        self.free_conns.push(id.index);
        debug_assert!(self.io.stats.conns_now > 0);
        self.io.stats.conns_now -= 1;
        self.io.actions.push(Action::Close { conn: id });
    }

    /// The connection's close log: who, which export, why, and what it did.
    fn log_closed(&self, c: &Conn) {
        let name = |i: u16| {
            (self.io.catalog.exports.get(usize::from(i))).map_or("?", |e| e.info.name.as_str())
        };
        let (export, what) = match &c.phase {
            Phase::Transmission { export, .. } => (name(*export), "connection closed"),
            Phase::Handshake(_) => ("-", "connection closed"),
            Phase::Nvme(n) => (n.export().map_or("-", name), "nvme/tcp: connection closed"),
        };
        let peer = if c.peer.is_empty() { "-" } else { &c.peer };
        debug_assert!(c.end.is_some(), "{:?} closed with no reason recorded", c.id);
        let reason = c.end.map_or_else(|| "unknown".into(), |r| format!("{r:?}"));
        tracing::info!(
            reactor = self.id,
            conn = c.id.index,
            peer,
            export,
            reason,
            replies = c.traffic.replies,
            bytes_in = c.traffic.bytes_in,
            bytes_out = c.traffic.bytes_out,
            seconds = (self.io.now - c.accepted_at) as f64 / 1e9,
            "{what}"
        );
    }

    /// The client of a connection, as [`Engine::set_peer`] named it.
    pub fn peer(&self, id: ConnId) -> &str {
        self.conn_ref(id).map_or("", |c| &c.peer)
    }

    /// Names the client of a connection just accepted, for its logs, and
    /// tells the pacer its host: connections from one address share that
    /// host's link (a Unix client is a host of its own).
    pub fn set_peer(&mut self, id: ConnId, peer: &str) {
        if let Some(c) = conn_at(&mut self.conns, id) {
            c.peer = peer.into();
            if matches!(c.phase, Phase::Nvme(_)) {
                // Its host is its host NQN, known at Connect (`nvme.rs`).
                return;
            }
            if let Ok(addr) = peer.parse::<std::net::SocketAddr>() {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::hash::Hash::hash(&addr.ip(), &mut h);
                self.io
                    .pacer
                    .open_flow(c.flow, std::hash::Hasher::finish(&h));
            }
        }
    }

    /// When the connection's current timeout fires, if one applies: the
    /// handshake's from accept, a payload's and an idle connection's from the
    /// last bytes received (or request finished).
    fn deadline(&self, c: &Conn) -> Option<Nanos> {
        let t = &self.timeouts;
        match c.input {
            Input::Handshake | Input::StartTls => Some(c.accepted_at + t.handshake),
            // No ICReq yet; or a PDU half received (an idle queue has no
            // timeout here: NVMe's keep-alive is the host's to ask for).
            Input::Pdus => match &c.phase {
                Phase::Nvme(n) if !n.initialized() => Some(c.accepted_at + t.handshake),
                _ if c.buffered() > 0 => Some(c.active_at + t.payload),
                _ => None,
            },
            // Only while the client's bytes could land: a piece waiting for
            // the pacer or a buffer is not the client's stall.
            Input::Payload(_) | Input::Discard(_) if c.recv != super::RecvOp::Idle => {
                Some(c.active_at + t.payload)
            }
            Input::Headers if c.requests == 0 => Some(c.active_at + t.idle),
            _ => None,
        }
    }

    /// Makes sure a timer entry fires no later than the connection's deadline.
    fn arm_timer(&mut self, id: ConnId) {
        let Some(c) = self.conn_ref(id) else { return };
        let Some(d) = self.deadline(c) else { return };
        if d < c.timer_at {
            if let Some(c) = conn_at(&mut self.conns, id) {
                c.timer_at = d;
            }
            self.conn_timers.push(Reverse((d, id)));
        }
    }

    /// Closes connections whose deadline has passed. Entries are checked
    /// against the connection's current deadline, so progress needs no
    /// heap update: an early entry re-arms itself.
    pub(super) fn fire_conn_timers(&mut self) {
        while let Some(Reverse((t, id))) = self.conn_timers.peek().copied() {
            if t > self.io.now {
                return;
            }
            self.conn_timers.pop();
            let Some(c) = conn_at(&mut self.conns, id) else {
                continue;
            };
            if c.timer_at != t {
                continue; // superseded by an earlier entry
            }
            c.timer_at = Nanos::MAX;
            let c = &**self.conns[id.index as usize].as_ref().expect("just seen");
            match self.deadline(c) {
                Some(d) if d <= self.io.now && c.life == Life::Open => {
                    tracing::info!(reactor = self.id, conn = id.index, input = ?c.input, "connection timed out");
                    self.io.stats.timeouts += 1;
                    if let Some(c) = conn_at(&mut self.conns, id) {
                        c.ending(EndReason::Timeout);
                    }
                    self.close(id);
                }
                _ => self.arm_timer(id),
            }
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
        for index in 0..self.conns.len() {
            let Some(c) = self.conns[index].as_deref_mut() else {
                continue;
            };
            let id = c.id;
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
        for index in 0..self.conns.len() {
            if let Some(c) = self.conns[index].as_deref_mut() {
                if c.life == Life::Open {
                    tracing::warn!(reactor = self.id, conn = index, "drain timed out; closing");
                    c.end = Some(EndReason::DrainTimeout);
                    let id = c.id;
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
        self.conns.iter().all(Option::is_none) || self.io.now - since > 2 * self.drain_timeout
    }
}
