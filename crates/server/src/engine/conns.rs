//! The engine's connection table: live connections by index, with each
//! slot's generation (a completion for a connection whose slot was reused
//! finds nothing); the connections with something to send this round; and
//! their timeouts, checked lazily against each connection's deadline.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pace::Nanos;

use super::conn::Conn;
use super::conn_state::{Life, Phase, SendOp};
use super::ids::{ConnId, GEN_MASK};
use super::io_path::IoPath;
use super::slot::Req;
use super::{Action, Timeouts};

pub struct Conns {
    table: Vec<Option<Box<Conn>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    /// The next connection's pacer flow: unique over the engine's life.
    next_flow: u64,
    /// Connections with something to send at the end of this round.
    send_ready: Vec<ConnId>,
    /// Connection timeouts, checked lazily against each connection's deadline.
    timers: BinaryHeap<Reverse<(Nanos, ConnId)>>,
}

impl Conns {
    pub fn new() -> Conns {
        Conns {
            table: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            next_flow: 1,
            send_ready: Vec::new(),
            timers: BinaryHeap::new(),
        }
    }

    /// The live connection `id`. Only its generation is compared: the
    /// connection in slot `i` has index `i` (`insert`), and the engine
    /// looks a connection up several times per event.
    pub fn get(&self, id: ConnId) -> Option<&Conn> {
        match self.table.get(id.index as usize) {
            Some(Some(c)) if c.id().gen == id.gen => {
                debug_assert_eq!(c.id().index, id.index);
                Some(c)
            }
            _ => None,
        }
    }

    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        match self.table.get_mut(id.index as usize) {
            Some(Some(c)) if c.id().gen == id.gen => {
                debug_assert_eq!(c.id().index, id.index);
                Some(c)
            }
            _ => None,
        }
    }

    /// A new connection in `phase`, in a free slot under a new generation,
    /// with a flow of its own; an NBD one's greeting is ready to send.
    pub fn insert(&mut self, phase: Phase, now: Nanos) -> ConnId {
        let index = self.free.pop().unwrap_or_else(|| {
            self.table.push(None);
            self.gens.push(0);
            (self.table.len() - 1) as u32
        });
        let gen = self.gens[index as usize].wrapping_add(1) & GEN_MASK;
        self.gens[index as usize] = gen;
        let id = ConnId { index, gen };
        let conn = Box::new(Conn::new(id, self.next_flow, phase, now));
        self.next_flow += 1;
        self.table[index as usize] = Some(conn);
        id
    }

    /// Frees `id`'s slot: the connection holds nothing any more.
    pub fn remove(&mut self, id: ConnId) {
        let Some(c) = self.get(id) else {
            debug_assert!(false, "{id:?} removed twice");
            return;
        };
        debug_assert!(c.quiet(), "{id:?} freed with operations in flight");
        debug_assert_eq!(c.committed(), 0, "{id:?} freed holding buffer commitments");
        debug_assert_eq!(c.payload_pieces(), 0, "{id:?} freed holding payload pieces");
        debug_assert!(
            c.out().replies().next().is_none(),
            "{id:?} freed with replies queued"
        );
        self.table[id.index as usize] = None;
        self.free.push(id.index);
    }

    /// The ids of the live connections, in slot order.
    pub fn ids(&self) -> Vec<ConnId> {
        self.iter().map(|c| c.id()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Conn> {
        self.table.iter().flatten().map(|c| &**c)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Conn> {
        self.table.iter_mut().flatten().map(|c| &mut **c)
    }

    /// Slots in the table, live or not: a bound on connection indexes.
    pub fn slots(&self) -> usize {
        self.table.len()
    }

    /// Live connections.
    pub fn open(&self) -> usize {
        self.iter().count()
    }

    /// The connection has something to send: at the end of this round.
    pub fn mark_send(&mut self, id: ConnId) {
        if let Some(c) = self.get_mut(id) {
            if c.send() == SendOp::Idle {
                c.set_send(SendOp::Ready);
                self.send_ready.push(id);
            }
        }
    }

    /// Posts the sends of the connections marked since the last round;
    /// false when none was marked. Sends posted may mark more (a send
    /// with nothing left touches its connection): the caller settles and
    /// goes again.
    #[inline]
    pub fn send_round(&mut self, reqs: &[Req], io: &mut IoPath) -> bool {
        // The engine flushes after every event; most have marked nothing.
        if self.send_ready.is_empty() {
            return false;
        }
        self.send_marked(reqs, io);
        true
    }

    /// `send_round`'s sends, once some connection is marked.
    #[inline(never)]
    fn send_marked(&mut self, reqs: &[Req], io: &mut IoPath) {
        let mut ready = std::mem::take(&mut self.send_ready);
        for &conn in &ready {
            self.start_send(conn, reqs, io);
        }
        ready.clear();
        if self.send_ready.is_empty() {
            self.send_ready = ready; // keeps its capacity
        }
    }

    /// When the next connection timer is due.
    pub fn next_timer(&self) -> Option<Nanos> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Makes sure a timer entry fires no later than the connection's deadline.
    pub fn arm_timer(&mut self, id: ConnId, timeouts: &Timeouts) {
        let Some(c) = self.get_mut(id) else { return };
        let Some(d) = c.deadline(timeouts) else {
            return;
        };
        if c.arm_timer(d) {
            self.timers.push(Reverse((d, id)));
        }
    }

    /// The next open connection whose deadline has passed by `now`, its
    /// timer entry spent. Entries are checked against the connection's
    /// current deadline, so progress needs no heap update: an early entry
    /// re-arms itself.
    pub fn next_timed_out(&mut self, now: Nanos, timeouts: &Timeouts) -> Option<ConnId> {
        while let Some(Reverse((t, id))) = self.timers.peek().copied() {
            if t > now {
                return None;
            }
            self.timers.pop();
            let Some(c) = self.get_mut(id) else {
                continue;
            };
            if !c.timer_fired(t) {
                continue; // superseded by an earlier entry
            }
            match c.deadline(timeouts) {
                Some(d) if d <= now && c.life() == super::Life::Open => return Some(id),
                _ => self.arm_timer(id, timeouts),
            }
        }
        None
    }

    /// Posts one sendmsg with the handshake bytes, or with every queued
    /// reply that fits.
    fn start_send(&mut self, id: ConnId, reqs: &[Req], io: &mut IoPath) {
        let Some(c) = self.get_mut(id) else {
            return;
        };
        if c.send() != SendOp::Ready {
            return;
        }
        if c.life() != Life::Open {
            c.set_send(SendOp::Idle);
            return;
        }
        match c.out_mut().next_msg(reqs, io.buf_size()) {
            Some(msg) => {
                c.set_send(SendOp::InFlight);
                io.act(Action::Send { conn: id, msg });
            }
            None => {
                c.set_send(SendOp::Idle);
                io.touch(id);
            }
        }
    }
}
