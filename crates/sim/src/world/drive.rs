//! The engines as the simulated world drives them: each reactor's engine
//! is told of its events and ticked when it asks to be; what it tells the
//! driver (its actions) the world carries out (`Sim::pump`). The bytes it
//! was told of are counted, to audit its own counts against.

use pace::Nanos;
use server::engine::{Action, ConnId, Engine, Received, Sent};

use super::clock::Clock;
use super::Ev;
use crate::target::Target;

pub(super) struct Drive {
    target: Target,
    /// When each reactor's next tick is due.
    tick_at: Vec<Option<Nanos>>,
    /// Reactors an event touched: their next tick is recomputed.
    touched: Vec<bool>,
    /// Reactors whose engine ran since their books were last audited.
    unaudited: Vec<bool>,
    /// Bytes each reactor's engine was told it received and sent.
    moved: Vec<(u64, u64)>,
    /// Scratch list of an engine's actions.
    actions: Vec<Action>,
}

impl Drive {
    pub fn new(target: Target, reactors: usize) -> Drive {
        Drive {
            target,
            tick_at: vec![None; reactors],
            touched: vec![false; reactors],
            unaudited: vec![false; reactors],
            moved: vec![(0, 0); reactors],
            actions: Vec::new(),
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    pub fn engines(&self) -> &[Engine] {
        &self.target.engines
    }

    pub fn engine(&mut self, r: usize) -> &mut Engine {
        &mut self.target.engines[r]
    }

    /// Reactor `r`'s engine runs now: its next tick is recomputed after
    /// the event, and its books are audited.
    pub fn touch(&mut self, r: usize) {
        self.touched[r] = true;
        self.unaudited[r] = true;
    }

    /// Reactor `r`'s actions since last asked (none: empty); the list
    /// comes back with [`Drive::done_with`].
    pub fn actions(&mut self, r: usize) -> Vec<Action> {
        self.target.engines[r].flush();
        let mut actions = std::mem::take(&mut self.actions);
        self.target.engines[r].take_actions(&mut actions);
        actions
    }

    pub fn done_with(&mut self, actions: Vec<Action>) {
        debug_assert!(actions.is_empty());
        self.actions = actions;
    }

    /// Tells reactor `r`'s engine of bytes received on `conn`.
    pub fn received(&mut self, r: usize, conn: ConnId, result: Received, now: Nanos) {
        if let Received::Data(n) = result {
            self.moved[r].0 += n as u64;
        }
        self.target.engines[r].on_recv(now, conn, result);
    }

    /// Tells reactor `r`'s engine its send on `conn` finished.
    pub fn sent(&mut self, r: usize, conn: ConnId, result: Sent, now: Nanos) {
        if let Sent::Bytes(n) = result {
            self.moved[r].1 += n as u64;
        }
        self.target.engines[r].on_send(now, conn, result);
    }

    /// Reactor `r`'s tick is due: false if an earlier one superseded it.
    pub fn tick(&mut self, r: usize, now: Nanos) -> bool {
        if self.tick_at[r] != Some(now) {
            return false;
        }
        self.tick_at[r] = None;
        self.target.engines[r].tick(now);
        true
    }

    /// Ticks reactor `r` if the pool woke it (grants, cache drains).
    pub fn wake(&mut self, r: usize, now: Nanos) -> bool {
        if !self.target.take_woken(r) {
            return false;
        }
        self.target.engines[r].tick(now);
        true
    }

    /// Each touched reactor's next tick goes on the clock when its engine
    /// asks for one.
    pub fn schedule_ticks(&mut self, clock: &mut Clock) {
        for r in 0..self.touched.len() {
            if !std::mem::take(&mut self.touched[r]) {
                continue;
            }
            let Some(t) = self.target.engines[r].next_deadline() else {
                continue;
            };
            let t = t.max(clock.now() + 1);
            if self.tick_at[r].is_none_or(|p| p > t) {
                self.tick_at[r] = Some(t);
                clock.at(t, Ev::Tick(r as u32));
            }
        }
    }

    /// Port `p`'s capacity changed to `gbps`: the pacers' port load hears.
    pub fn port_rate(&self, p: usize, gbps: f64) {
        self.target.ports.set_capacity(p, gbps);
    }

    /// Bytes of the buffers held by requests now.
    pub fn in_use_bytes(&self) -> u64 {
        self.target.buffer_bytes_in_use()
    }

    /// The books of the engines that ran since the last audit
    /// ([`Engine::audit`]), the bytes each was told of, and the pool's
    /// count of its buffers.
    pub fn books(&mut self) -> Result<(), String> {
        let mut held = 0;
        for (r, e) in self.target.engines.iter().enumerate() {
            held += e.buffers_in_use();
            if !std::mem::take(&mut self.unaudited[r]) {
                continue;
            }
            e.audit().map_err(|b| format!("reactor {r}: books: {b}"))?;
            let (moved_in, moved_out) = e.bytes_moved();
            let (was_in, was_out) = self.moved[r];
            if (moved_in, moved_out) != (was_in, was_out) {
                return Err(format!(
                    "reactor {r}: bytes counted in/out {moved_in}/{moved_out}, moved {was_in}/{was_out}"
                ));
            }
        }
        let pool = &self.target.pool;
        let (free, total) = (pool.free_total(), u64::from(pool.total()));
        if held + free != total {
            return Err(format!(
                "pool: {held} buffers held + {free} free != {total}"
            ));
        }
        Ok(())
    }
}
