//! The link's window shared by every reactor's pacer, split by backlog.
//!
//! Each reactor sizes a window from what it delivers. Kept apart, equal
//! windows make equal release rates, and the reactors' queues then drift
//! apart at random (IO lands on a reactor by its connection, and nothing
//! pulls the queues level), so one reactor's IO waits ten times longer than
//! another's. Summed and handed out in proportion to the bytes each reactor
//! has queued, the same total window drains every queue in about the same
//! time: the reactors behave as one queue, and the tail shrinks to the wait.
//! The sum also bounds what all of them hold: a reactor whose share fell
//! (its tenant is held back) keeps what it has in flight, and the others
//! wait for it to land.
//!
//! Each host's window is pooled the same way: a host's connections spread
//! over the reactors, and its window on each is its part of the sum of its
//! windows on all of them, by the bytes it has queued there. Hosts are kept
//! in `HOST_SLOTS` slots by id; two hosts in one slot pool their windows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct LinkWindow {
    /// Each reactor's own window, bytes.
    windows: Vec<AtomicU64>,
    /// Each reactor's queued bytes.
    queued: Vec<AtomicU64>,
    /// Each reactor's bytes in flight, as its window counts them.
    in_flight: Vec<AtomicU64>,
    /// Per host slot and reactor: the host's window there and its queued
    /// bytes there.
    host_windows: Vec<AtomicU64>,
    host_queued: Vec<AtomicU64>,
}

/// Host slots in a [`LinkWindow`].
const HOST_SLOTS: usize = 64;

impl LinkWindow {
    pub fn new(reactors: usize) -> Arc<LinkWindow> {
        let zeros = || (0..reactors.max(1)).map(|_| AtomicU64::new(0)).collect();
        let host_zeros = || {
            (0..reactors.max(1) * HOST_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect()
        };
        Arc::new(LinkWindow {
            windows: zeros(),
            queued: zeros(),
            in_flight: zeros(),
            host_windows: host_zeros(),
            host_queued: host_zeros(),
        })
    }

    pub fn reactors(&self) -> usize {
        self.windows.len()
    }

    /// Reactor `r`'s own window, queued bytes and bytes in flight now.
    pub fn publish(&self, r: usize, window: u64, queued: u64, in_flight: u64) {
        if let (Some(w), Some(q), Some(f)) = (
            self.windows.get(r),
            self.queued.get(r),
            self.in_flight.get(r),
        ) {
            w.store(window, Ordering::Relaxed);
            q.store(queued, Ordering::Relaxed);
            f.store(in_flight, Ordering::Relaxed);
        }
    }

    fn host_slot(&self, host: u64) -> usize {
        // Host ids are hashes or small indices: mix before taking the slot.
        (host.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % HOST_SLOTS
    }

    /// Host `host`'s window and queued bytes on reactor `r` now.
    pub fn publish_host(&self, r: usize, host: u64, window: u64, queued: u64) {
        let i = self.host_slot(host) * self.reactors() + r;
        if let (Some(w), Some(q)) = (self.host_windows.get(i), self.host_queued.get(i)) {
            w.store(window, Ordering::Relaxed);
            q.store(queued, Ordering::Relaxed);
        }
    }

    /// Host `host`'s part on reactor `r` of its windows on every reactor:
    /// in proportion to its queued bytes there (`own`, its window on `r`,
    /// while it has nothing queued anywhere).
    pub fn host_share(&self, r: usize, host: u64, own: u64) -> u64 {
        let n = self.reactors();
        if r >= n {
            return own;
        }
        let base = self.host_slot(host) * n;
        let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let total_queued: u64 = self.host_queued[base..base + n].iter().map(load).sum();
        if total_queued == 0 {
            return own;
        }
        let total_window: u64 = self.host_windows[base..base + n].iter().map(load).sum();
        let own_queued = load(&self.host_queued[base + r]);
        (total_window as f64 * own_queued as f64 / total_queued as f64) as u64
    }

    /// Reactor `r`'s part of all the windows: in proportion to its share of
    /// the queued bytes (its own window while nothing is queued anywhere),
    /// and no more than the others leave free.
    pub fn share(&self, r: usize) -> Option<u64> {
        let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let total_queued: u64 = self.queued.iter().map(load).sum();
        let own_queued = load(self.queued.get(r)?);
        let total_window: u64 = self.windows.iter().map(load).sum();
        if total_queued == 0 {
            return self.windows.get(r).map(load);
        }
        let others: u64 = self.in_flight.iter().map(load).sum::<u64>() - load(&self.in_flight[r]);
        let part = (total_window as f64 * own_queued as f64 / total_queued as f64) as u64;
        // The others' IO in flight may exceed every window: windows shrink
        // while IO is out, and each reactor publishes on its own.
        Some(part.min(total_window.saturating_sub(others)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summed_window_follows_the_backlog() {
        let l = LinkWindow::new(2);
        l.publish(0, 1000, 0, 0);
        l.publish(1, 1000, 0, 0);
        assert_eq!(l.share(0), Some(1000), "nothing queued: own window");
        l.publish(0, 1000, 300, 0);
        l.publish(1, 1000, 100, 0);
        assert_eq!(l.share(0), Some(1500));
        assert_eq!(l.share(1), Some(500));
        // Reactor 1 holds more than its part: reactor 0 gets what is left.
        l.publish(1, 1000, 100, 800);
        assert_eq!(l.share(0), Some(1200));
        assert_eq!(l.share(2), None, "an unknown reactor has no share");
        l.publish(7, 1, 1, 1);
    }

    #[test]
    fn a_hosts_windows_are_pooled_by_its_backlog() {
        let l = LinkWindow::new(2);
        assert_eq!(l.host_share(0, 9, 500), 500, "nothing queued: own window");
        l.publish_host(0, 9, 1000, 300);
        l.publish_host(1, 9, 1000, 100);
        assert_eq!(l.host_share(0, 9, 1000), 1500);
        assert_eq!(l.host_share(1, 9, 1000), 500);
        assert_eq!(
            l.host_share(2, 9, 77),
            77,
            "an unknown reactor keeps its own"
        );
        l.publish_host(0, 9, 0, 0);
        l.publish_host(1, 9, 0, 0);
        assert_eq!(l.host_share(0, 9, 64), 64, "a host gone: own window");
    }
}
