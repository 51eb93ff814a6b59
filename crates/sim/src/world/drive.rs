//! Driving the engines: their events from the simulated world, and their
//! actions carried out in it.

use bdev::{IoOp, IoResult};
use pace::pacer::IoKind;
use pace::Nanos;
use server::engine::{Action, ConnId, Input, IoToken, Received, Sent, TlsOutcome};

use super::{Dir, Ev, Sim};
use crate::hosts::{self, Dial};
use crate::scenario::Protocol;
use crate::socket::{send_len, Feed, Sock};

impl Sim<'_> {
    /// Opens a host's connection: the target accepts it and the handshake
    /// runs to its end at once (its round trips are not simulated).
    /// Returns its socket.
    pub(super) fn connect(&mut self, dial: Dial) -> usize {
        if self.hosts[dial.host].protocol == Protocol::NvmeTcp {
            return self.connect_nvme(dial);
        }
        let r = dial.reactor;
        let tenant = self.hosts[dial.host].tenant;
        let export = self.target.export(dial.device, tenant);
        let Some(conn) = self.target.engines[r].accept(self.now, None) else {
            debug_assert!(false, "a new engine is not draining");
            return usize::MAX;
        };
        let s = self.socks.len();
        // Each host has an address of its own: the target's pacer pools the
        // windows of one host's connections, as it does for a real peer.
        let peer = format!(
            "10.{}.{}.1:{}",
            dial.host / 256,
            dial.host % 256,
            40_000 + s % 20_000
        );
        let port = Some(self.hosts[dial.host].port);
        self.target.engines[r].set_peer(conn, &peer, port);
        let slots = &mut self.sock_of[r];
        if slots.len() <= conn.index as usize {
            slots.resize(conn.index as usize + 1, u32::MAX);
        }
        slots[conn.index as usize] = s as u32;
        let mut sock = Sock::new(r, conn, dial.host);
        sock.send_in(self.now, hosts::handshake(&export), 0);
        self.socks.push(sock);
        self.pump(r);
        let state = self.target.engines[r].conn_state(conn).map(|c| c.0);
        debug_assert_eq!(state, Some(Input::Headers), "{export}: handshake failed");
        self.socks[s].negotiated = true;
        s
    }

    pub(super) fn sock(&self, r: usize, conn: ConnId) -> usize {
        self.sock_of[r][conn.index as usize] as usize
    }

    /// Carries out reactor `r`'s actions until it has none.
    pub(super) fn pump(&mut self, r: usize) {
        self.touched[r] = true;
        self.unaudited[r] = true;
        loop {
            self.target.engines[r].flush();
            let mut actions = std::mem::take(&mut self.actions);
            self.target.engines[r].take_actions(&mut actions);
            if actions.is_empty() {
                self.actions = actions;
                return;
            }
            for a in actions.drain(..) {
                self.apply(r, a);
            }
            self.actions = actions;
        }
    }

    fn apply(&mut self, r: usize, action: Action) {
        match action {
            Action::Recv { conn, buf, len } => {
                let s = self.sock(r, conn);
                self.socks[s].post_recv(buf, len);
                match self.socks[s].fate.deaf() {
                    true => self.fail_later(s),
                    false => self.feed(s),
                }
            }
            Action::Send { conn, msg } => self.post_send(r, conn, msg),
            // The simulated hosts never ask for STARTTLS.
            Action::StartTls { conn } => {
                debug_assert!(false, "reactor {r}: STARTTLS on {conn:?}");
                self.target.engines[r].on_tls(self.now, conn, TlsOutcome::Failed);
            }
            Action::Submit { io, export, req } => {
                let device = self.target.device(export);
                let kind = match req.op {
                    IoOp::Read => IoKind::Read,
                    _ => IoKind::Write,
                };
                let done = self.devs[device].start(self.now, kind, req.len);
                let (errno, stall) = self.device_fault(io);
                self.at(done + stall, Ev::DeviceDone(r as u32, io, self.now, errno));
            }
            Action::Shutdown { conn, read_only } if self.faults.is_some() => {
                self.shut(r, conn, read_only)
            }
            Action::Close { conn } if self.faults.is_some() => self.closed(r, conn),
            // Hosts never hang up and nothing times out within a run.
            Action::Shutdown { conn, .. } | Action::Close { conn } => {
                debug_assert!(false, "reactor {r} closes {conn:?}");
            }
        }
    }

    /// Tells reactor `r`'s engine of bytes received on `conn`.
    pub(super) fn received(&mut self, r: usize, conn: ConnId, result: Received) {
        if let Received::Data(n) = result {
            self.moved[r].0 += n as u64;
        }
        self.target.engines[r].on_recv(self.now, conn, result);
        self.pump(r);
    }

    /// Tells reactor `r`'s engine its send on `conn` finished.
    pub(super) fn sent(&mut self, r: usize, conn: ConnId, result: Sent) {
        if let Sent::Bytes(n) = result {
            self.moved[r].1 += n as u64;
        }
        self.target.engines[r].on_send(self.now, conn, result);
    }

    /// Hands socket `s`'s arrived bytes to its posted recv, or starts its
    /// payload across the links.
    pub(super) fn feed(&mut self, s: usize) {
        let now = self.now;
        if self.socks[s].fate.deaf() {
            return;
        }
        let (r, conn) = (self.socks[s].reactor, self.socks[s].conn);
        match self.socks[s].feed(now) {
            Feed::Wait => {}
            Feed::Copied(n) => self.received(r, conn, Received::Data(n)),
            Feed::Eof => self.received(r, conn, Received::Eof),
            Feed::Cross(n) => {
                let host = self.socks[s].host;
                let port = self.hosts[host].port;
                self.ingress[port].push(host, s as u64, n);
                self.kick(Dir::Ingress, port);
            }
        }
    }

    pub(super) fn crossed(&mut self, s: usize) {
        if self.socks[s].fate.deaf() {
            return; // the recv failed meanwhile
        }
        let n = self.socks[s].crossed();
        let (r, conn) = (self.socks[s].reactor, self.socks[s].conn);
        self.received(r, conn, Received::Data(n));
    }

    /// The engine posted a send: during the handshake it goes at once;
    /// after it, its new replies queue on the host's port.
    fn post_send(&mut self, r: usize, conn: ConnId, msg: *const libc::msghdr) {
        let s = self.sock(r, conn);
        if !self.socks[s].negotiated {
            let n = match self.socks[s].setup_rx.is_some() {
                true => self.socks[s].capture(msg),
                false => send_len(msg),
            };
            self.sent(r, conn, Sent::Bytes(n));
            return;
        }
        if self.socks[s].fate.down() {
            self.socks[s].hold_send();
            self.fail_later(s);
            return;
        }
        let mut chunks = std::mem::take(&mut self.chunks);
        let ios = &self.ios;
        let data_len = |cookie: u64, error: u32| {
            let io = &ios[cookie as usize];
            if io.read && error == 0 {
                io.bytes
            } else {
                0
            }
        };
        self.socks[s].post_send(msg, data_len, &mut chunks);
        if self.socks[s].paused {
            // The host stopped reading: its window is shut.
            self.socks[s].held.append(&mut chunks);
        }
        let host = self.socks[s].host;
        let port = self.hosts[host].port;
        for c in chunks.drain(..) {
            self.egress[port].push(host, s as u64, c.bytes);
        }
        self.chunks = chunks;
        self.kick(Dir::Egress, port);
    }

    /// The port carried socket `s`'s oldest chunk: the engine's send
    /// reports it, and a reply's last chunk crosses back to the host.
    pub(super) fn tx_done(&mut self, s: usize, link_done: Nanos) {
        if self.socks[s].fate.down() {
            return; // its send failed meanwhile
        }
        let (chunk, sent) = self.socks[s].carried();
        if let Some(c) = chunk {
            let at = link_done + self.hosts[self.socks[s].host].rtt / 2;
            match c.nvme {
                Some(mark) => self.nvme_mark(s, c.cookie as u16, mark, at),
                None if c.last => self.at(at, Ev::Reply(c.cookie as u32)),
                None => {}
            }
        }
        if let Some(n) = sent {
            let (r, conn) = (self.socks[s].reactor, self.socks[s].conn);
            self.sent(r, conn, Sent::Bytes(n));
            self.pump(r);
        }
    }

    pub(super) fn device_done(&mut self, r: usize, io: IoToken, submitted: Nanos, errno: u32) {
        if self.measuring {
            self.device_lat.record(self.now - submitted);
        }
        let result = match errno {
            0 => IoResult::Ok,
            e => IoResult::Err(e),
        };
        self.target.engines[r].on_io_done(self.now, io, result);
        self.pump(r);
    }

    pub(super) fn tick(&mut self, r: usize) {
        if self.tick_at[r] != Some(self.now) {
            return; // superseded by an earlier tick
        }
        self.tick_at[r] = None;
        self.target.engines[r].tick(self.now);
        self.pump(r);
    }

    /// After an event: reactors the pool woke run at once, each touched
    /// reactor's next tick is due when its engine asks, and the buffer
    /// gauge moves.
    pub(super) fn settle(&mut self) {
        loop {
            let mut any = false;
            for r in 0..self.target.engines.len() {
                if self.target.take_woken(r) {
                    self.target.engines[r].tick(self.now);
                    self.pump(r);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        for r in 0..self.touched.len() {
            if std::mem::take(&mut self.touched[r]) {
                self.schedule_tick(r);
            }
        }
        self.bufs_gauge.update(self.now, self.in_use_bytes());
    }

    fn schedule_tick(&mut self, r: usize) {
        let Some(t) = self.target.engines[r].next_deadline() else {
            return;
        };
        let t = t.max(self.now + 1);
        if self.tick_at[r].is_none_or(|p| p > t) {
            self.tick_at[r] = Some(t);
            self.at(t, Ev::Tick(r as u32));
        }
    }
}
