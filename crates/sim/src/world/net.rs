//! The network between the hosts and the target: each connection's socket
//! and the target's ports, one per direction, which share their bytes
//! fairly between hosts and let each host's link hold that host to its
//! rate ([`crate::ports`]). A port's speed is scaled by the memory/DDIO
//! factor its caller passes (`speed`).

use pace::Nanos;
use server::engine::{ConnId, Received};

use super::clock::Clock;
use super::ios::Ios;
use super::{Dir, Ev};
use crate::hosts::Host;
use crate::nvme_host::HostQueue;
use crate::ports::{Port, Start};
use crate::scenario::Scenario;
use crate::socket::{send_len, Chunk, Feed, Sock};

/// One direction of every target port, each host a flow on its own.
fn ports(sc: &Scenario, hosts: &[Host]) -> Vec<Port> {
    let mut ports: Vec<Port> = sc
        .ports
        .iter()
        .map(|p| Port::new(p.rate_gbps * 1e9))
        .collect();
    for (i, h) in hosts.iter().enumerate() {
        ports[h.port].add_flow(i, sc.hosts[h.group].link_gbps.map(|r| r * 1e9));
    }
    ports
}

/// What became of a send the engine posted.
pub(super) enum Posted {
    /// A handshake send: it went at once, all these bytes.
    Now(usize),
    /// On a socket that is down: it fails.
    Down,
    /// Its replies queued on the host's port.
    Queued,
}

pub(super) struct Net {
    socks: Vec<Sock>,
    /// Per reactor, the socket of each connection slot.
    sock_of: Vec<Vec<u32>>,
    /// Each host's port.
    port_of: Vec<usize>,
    egress: Vec<Port>,
    ingress: Vec<Port>,
    /// Each port's rate step, if its scenario has one: when, and to what.
    steps: Vec<Option<(Nanos, f64)>>,
    /// Scratch list of a send's chunks.
    chunks: Vec<Chunk>,
    /// The memory/DDIO model: MiB of buffers the cache holds, the slope
    /// of the slow-down past it (per doubling) and its floor.
    ddio: (f64, f64, f64),
}

impl Net {
    pub fn new(sc: &Scenario, hosts: &[Host], reactors: usize) -> Net {
        let t = &sc.target;
        Net {
            socks: Vec::new(),
            sock_of: vec![Vec::new(); reactors],
            port_of: hosts.iter().map(|h| h.port).collect(),
            egress: ports(sc, hosts),
            ingress: ports(sc, hosts),
            steps: sc
                .ports
                .iter()
                .map(|p| p.step.map(|(ms, g)| (ms * 1_000_000, g * 1e9)))
                .collect(),
            chunks: Vec::new(),
            ddio: (t.ddio_budget_mib, t.ddio_slope, t.ddio_floor),
        }
    }

    /// The ports' speed with `bytes` held in buffers: scaled down once
    /// they exceed the cache budget.
    pub fn speed(&self, bytes: u64) -> f64 {
        let (budget, slope, floor) = self.ddio;
        let mib = bytes as f64 / (1u64 << 20) as f64;
        if mib <= budget {
            return 1.0;
        }
        (1.0 - slope * (mib / budget).log2()).max(floor)
    }

    /// The socket of a connection the target just opened: its number.
    pub fn add(&mut self, sock: Sock) -> usize {
        let (s, r, conn) = (self.socks.len(), sock.reactor, sock.conn);
        let slots = &mut self.sock_of[r];
        if slots.len() <= conn.index as usize {
            slots.resize(conn.index as usize + 1, u32::MAX);
        }
        slots[conn.index as usize] = s as u32;
        self.socks.push(sock);
        s
    }

    /// The number the next socket gets.
    pub fn next(&self) -> usize {
        self.socks.len()
    }

    pub fn sock(&self, s: usize) -> &Sock {
        &self.socks[s]
    }

    pub fn sock_mut(&mut self, s: usize) -> &mut Sock {
        &mut self.socks[s]
    }

    pub fn socks(&self) -> &[Sock] {
        &self.socks
    }

    /// NVMe/TCP socket `s`'s setup is over: `q` is its host's side of
    /// the I/O queue.
    pub fn nvme_ready(&mut self, s: usize, q: HostQueue) {
        let sock = &mut self.socks[s];
        sock.nvme = Some(Box::new(q));
        sock.setup_rx = None;
        sock.negotiated = true;
    }

    /// The socket of reactor `r`'s connection `conn`.
    pub fn of(&self, r: usize, conn: ConnId) -> usize {
        self.sock_of[r][conn.index as usize] as usize
    }

    /// Sockets that are up and past their handshake.
    pub fn up(&self) -> Vec<usize> {
        (0..self.socks.len())
            .filter(|&s| !self.socks[s].fate.down() && self.socks[s].negotiated)
            .collect()
    }

    fn port(&mut self, dir: Dir, port: usize) -> &mut Port {
        match dir {
            Dir::Egress => &mut self.egress[port],
            Dir::Ingress => &mut self.ingress[port],
        }
    }

    /// Sends the port's next segment if it is idle.
    pub fn kick(&mut self, dir: Dir, p: usize, speed: f64, clock: &mut Clock) {
        match self.port(dir, p).start(clock.now(), speed) {
            Start::Sent(seg) => {
                if let Some(token) = seg.finished {
                    match dir {
                        Dir::Egress => {
                            clock.at(seg.port_done, Ev::TxDone(token as u32, seg.link_done))
                        }
                        Dir::Ingress => clock.at(seg.link_done, Ev::Crossed(token as u32)),
                    }
                }
                clock.at(seg.port_done, Ev::PortFree(dir, p as u32));
            }
            Start::WaitUntil(t) => {
                let port = self.port(dir, p);
                if port.wake_at.is_none_or(|w| w > t) {
                    port.wake_at = Some(t);
                    clock.at(t, Ev::PortWake(dir, p as u32));
                }
            }
            Start::Nothing => {}
        }
    }

    /// The port finished a segment: the next one goes.
    pub fn port_free(&mut self, dir: Dir, p: usize, speed: f64, clock: &mut Clock) {
        self.port(dir, p).done();
        self.kick(dir, p, speed, clock);
    }

    /// The port's wake-up came, unless a later one superseded it.
    pub fn port_wake(&mut self, dir: Dir, p: usize, speed: f64, clock: &mut Clock) {
        let port = self.port(dir, p);
        if port.wake_at == Some(clock.now()) {
            port.wake_at = None;
            self.kick(dir, p, speed, clock);
        }
    }

    /// Each port's rate step goes on the clock.
    pub fn schedule_steps(&self, clock: &mut Clock) {
        for (p, step) in self.steps.iter().enumerate() {
            if let Some((t, _)) = step {
                clock.at(*t, Ev::Rate(p as u32));
            }
        }
    }

    /// Port `p`'s rate step is due: both directions take it; the new rate.
    pub fn step(&mut self, p: usize) -> Option<f64> {
        let (_, rate) = self.steps[p].take()?;
        self.egress[p].set_rate(rate);
        self.ingress[p].set_rate(rate);
        Some(rate)
    }

    /// The engine posted a recv on socket `s`: false if the socket is deaf
    /// (the recv will fail).
    pub fn post_recv(&mut self, s: usize, buf: *mut u8, len: usize) -> bool {
        self.socks[s].post_recv(buf, len);
        !self.socks[s].fate.deaf()
    }

    /// Hands socket `s`'s arrived bytes to its posted recv (what its
    /// engine is to be told: reactor, connection, result), or starts its
    /// payload across the links.
    pub fn feed(
        &mut self,
        s: usize,
        speed: f64,
        clock: &mut Clock,
    ) -> Option<(usize, ConnId, Received)> {
        let sock = &mut self.socks[s];
        if sock.fate.deaf() {
            return None;
        }
        let (r, conn) = (sock.reactor, sock.conn);
        match sock.feed(clock.now()) {
            Feed::Wait => None,
            Feed::Copied(n) => Some((r, conn, Received::Data(n))),
            Feed::Eof => Some((r, conn, Received::Eof)),
            Feed::Cross(n) => {
                let host = sock.host;
                let port = self.port_of[host];
                self.ingress[port].push(host, s as u64, n);
                self.kick(Dir::Ingress, port, speed, clock);
                None
            }
        }
    }

    /// Socket `s`'s payload bytes crossed into its posted recv: what its
    /// engine is to be told (none if the recv failed meanwhile).
    pub fn crossed(&mut self, s: usize) -> Option<(usize, ConnId, Received)> {
        let sock = &mut self.socks[s];
        if sock.fate.deaf() {
            return None;
        }
        let n = sock.crossed();
        Some((sock.reactor, sock.conn, Received::Data(n)))
    }

    /// The engine posted a send on socket `s`: during the handshake it
    /// goes at once; after it, its new replies queue on the host's port.
    pub fn post_send(
        &mut self,
        s: usize,
        msg: *const libc::msghdr,
        ios: &Ios,
        speed: f64,
        clock: &mut Clock,
    ) -> Posted {
        let sock = &mut self.socks[s];
        if !sock.negotiated {
            return Posted::Now(match sock.setup_rx.is_some() {
                true => sock.capture(msg),
                false => send_len(msg),
            });
        }
        if sock.fate.down() {
            sock.hold_send();
            return Posted::Down;
        }
        let mut chunks = std::mem::take(&mut self.chunks);
        sock.post_send(
            msg,
            |cookie, error| ios.data_len(cookie, error),
            &mut chunks,
        );
        if sock.paused {
            // The host stopped reading: its window is shut.
            sock.held.append(&mut chunks);
        }
        let host = sock.host;
        let port = self.port_of[host];
        for c in chunks.drain(..) {
            self.egress[port].push(host, s as u64, c.bytes);
        }
        self.chunks = chunks;
        self.kick(Dir::Egress, port, speed, clock);
        Posted::Queued
    }

    /// The port carried socket `s`'s oldest chunk (None if its send failed
    /// meanwhile): the chunk, and the bytes its send has seen go.
    pub fn carried(&mut self, s: usize) -> Option<(Option<Chunk>, Option<usize>)> {
        if self.socks[s].fate.down() {
            return None;
        }
        Some(self.socks[s].carried())
    }

    /// A host that stopped reading socket `s` reads again: what it held
    /// back goes on the port.
    pub fn resume(&mut self, s: usize, speed: f64, clock: &mut Clock) {
        let sock = &mut self.socks[s];
        if sock.fate.down() || !sock.paused {
            return;
        }
        sock.paused = false;
        let held = std::mem::take(&mut sock.held);
        let host = sock.host;
        let port = self.port_of[host];
        for c in held {
            self.egress[port].push(host, s as u64, c.bytes);
        }
        self.kick(Dir::Egress, port, speed, clock);
    }

    /// Host `h`'s link is down until `until`, both ways.
    pub fn hold(&mut self, h: usize, until: Nanos, speed: f64, clock: &mut Clock) {
        let port = self.port_of[h];
        self.egress[port].hold(h, until);
        self.ingress[port].hold(h, until);
        self.kick(Dir::Egress, port, speed, clock);
        self.kick(Dir::Ingress, port, speed, clock);
    }
}
