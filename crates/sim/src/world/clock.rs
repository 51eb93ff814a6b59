//! The simulated time and the events due at later times, in the order
//! they were scheduled when their times tie.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pace::Nanos;

use super::Ev;

pub(super) struct Clock {
    now: Nanos,
    /// Events scheduled so far: ties go in this order.
    seq: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
        }
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Moves the time (to an event's, or back to 0 after the first IOs).
    pub fn set(&mut self, t: Nanos) {
        self.now = t;
    }

    /// `ev` happens at `t`.
    pub fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// `ev` happens now.
    pub fn now_do(&mut self, ev: Ev) {
        self.at(self.now, ev);
    }

    /// The next event, if one is due by `end`: it is taken, not yet
    /// handled (the time does not move).
    pub fn next_by(&mut self, end: Nanos) -> Option<(Nanos, Ev)> {
        match self.events.peek() {
            Some(Reverse((t, _, _))) if *t <= end => {}
            _ => return None,
        }
        let Reverse((t, _, ev)) = self.events.pop()?;
        Some((t, ev))
    }
}
