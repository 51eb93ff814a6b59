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
//! wait for it to land. A reactor keeps what its queue and IO in flight
//! would use of its own window, however deep the others' queues: bytes
//! queued do not show every client's demand (an NBD writer shows one piece
//! at a time), so they share out only what reactors leave unused.
//!
//! With tenants, the backlog speaks for each tenant only among its own
//! reactors: the windows are first split between the tenants by where
//! each reactor's backlog comes from, then each tenant's part between the
//! reactors by its bytes queued there. A tenant's backlog grows with its
//! clients' queue depth (one of 64 KiB READs at QD 1024 queues 64 MiB per
//! reactor) while a tenant of streamed 1 MiB READs queues a few pieces per
//! connection at any depth; split by bytes queued alone, the deep tenant's
//! reactors took nearly all the windows, the other's fell to the 2-IO
//! floor, and the tenant clock then held the deep tenant to its weight
//! times that: the link ran at 93% (`tenants_mixed_sizes`, QD 1024). The
//! tenants' shares of the link are the tenant clock's to set, not the
//! depth of their queues'. Tenants spread alike over the reactors get the
//! split by bytes queued, as one tenant does.
//!
//! Each host's window is pooled the same way: a host's connections spread
//! over the reactors, and its window on each is its part of the sum of its
//! windows on all of them, by the bytes it has queued there. Hosts are kept
//! in `HOST_SLOTS` slots by id; two hosts in one slot pool their windows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct LinkWindow {
    reactors: Vec<ReactorPart>,
    /// Some reactor serves two or more tenants' IO (see `tenant_part`).
    tenants: AtomicBool,
}

/// What one reactor publishes. Only that reactor writes it; aligned to a
/// cache line so its stores do not take another reactor's part from the
/// readers.
#[derive(Debug)]
#[repr(align(64))]
struct ReactorPart {
    /// Its own window, bytes.
    window: AtomicU64,
    /// Its queued bytes.
    queued: AtomicU64,
    /// Its bytes in flight, as its window counts them.
    in_flight: AtomicU64,
    /// Per host slot: the host's window here and its queued bytes here.
    host_windows: [AtomicU64; HOST_SLOTS],
    host_queued: [AtomicU64; HOST_SLOTS],
    /// Per tenant slot: the tenant's part of `queued`.
    tenant_queued: [AtomicU64; TENANT_SLOTS],
}

/// Tenant slots in a [`LinkWindow`]: tenant `t` is slot `t % TENANT_SLOTS`
/// (two tenants in one slot split the windows as one).
pub(super) const TENANT_SLOTS: usize = 8;

/// Host slots in a [`LinkWindow`].
const HOST_SLOTS: usize = 64;

/// Stores `v` only if it changed: every reactor publishes on every request,
/// and a store, even of the same value, takes the cache line from the
/// reactors that read it.
pub(super) fn store_changed(a: &AtomicU64, v: u64) {
    if a.load(Ordering::Relaxed) != v {
        a.store(v, Ordering::Relaxed);
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// A host's slot. Host ids are hashes or small indices: mix before taking
/// the slot.
fn host_slot(host: u64) -> usize {
    (host.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % HOST_SLOTS
}

impl LinkWindow {
    pub fn new(reactors: usize) -> Arc<LinkWindow> {
        let part = || ReactorPart {
            window: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            host_windows: std::array::from_fn(|_| AtomicU64::new(0)),
            host_queued: std::array::from_fn(|_| AtomicU64::new(0)),
            tenant_queued: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        Arc::new(LinkWindow {
            reactors: (0..reactors.max(1)).map(|_| part()).collect(),
            tenants: AtomicBool::new(false),
        })
    }

    pub fn reactors(&self) -> usize {
        self.reactors.len()
    }

    /// How many reactors have IO queued or in flight now.
    pub fn busy_reactors(&self) -> usize {
        self.reactors
            .iter()
            .filter(|p| load(&p.queued) > 0 || load(&p.in_flight) > 0)
            .count()
    }

    /// Reactor `r`'s own window, queued bytes and bytes in flight now.
    pub fn publish(&self, r: usize, window: u64, queued: u64, in_flight: u64) {
        if let Some(p) = self.reactors.get(r) {
            store_changed(&p.window, window);
            store_changed(&p.queued, queued);
            store_changed(&p.in_flight, in_flight);
        }
    }

    /// Tenant `t`'s part of the bytes reactor `r` published as queued
    /// (see `publish`), tenant by tenant in order.
    pub fn publish_tenants(&self, r: usize, queued: impl IntoIterator<Item = u64>) {
        let Some(p) = self.reactors.get(r) else {
            return;
        };
        if !self.tenants.load(Ordering::Relaxed) {
            self.tenants.store(true, Ordering::Relaxed);
        }
        let mut slots = [0u64; TENANT_SLOTS];
        for (t, q) in queued.into_iter().enumerate() {
            slots[t % TENANT_SLOTS] += q;
        }
        for (a, v) in p.tenant_queued.iter().zip(slots) {
            store_changed(a, v);
        }
    }

    /// Host `host`'s window and queued bytes on reactor `r` now.
    pub fn publish_host(&self, r: usize, host: u64, window: u64, queued: u64) {
        if let Some(p) = self.reactors.get(r) {
            let i = host_slot(host);
            store_changed(&p.host_windows[i], window);
            store_changed(&p.host_queued[i], queued);
        }
    }

    /// Host `host`'s part on reactor `r` of its windows on every reactor:
    /// in proportion to its queued bytes there (`own`, its window on `r`,
    /// while it has nothing queued anywhere).
    pub fn host_share(&self, r: usize, host: u64, own: u64) -> u64 {
        let Some(mine) = self.reactors.get(r) else {
            return own;
        };
        let i = host_slot(host);
        let total_queued: u64 = self.reactors.iter().map(|p| load(&p.host_queued[i])).sum();
        if total_queued == 0 {
            return own;
        }
        let total_window: u64 = self.reactors.iter().map(|p| load(&p.host_windows[i])).sum();
        let own_queued = load(&mine.host_queued[i]);
        (total_window as f64 * own_queued as f64 / total_queued as f64) as u64
    }

    /// Reactor `r`'s part of all the windows: in proportion to its share of
    /// the queued bytes (its own window while nothing is queued anywhere),
    /// at least what it would use of its own window, and no more than the
    /// others leave free.
    pub fn share(&self, r: usize) -> Option<u64> {
        let mine = self.reactors.get(r)?;
        let total_queued: u64 = self.reactors.iter().map(|p| load(&p.queued)).sum();
        let total_window: u64 = self.reactors.iter().map(|p| load(&p.window)).sum();
        if total_queued == 0 {
            return Some(load(&mine.window));
        }
        let in_flight: u64 = self.reactors.iter().map(|p| load(&p.in_flight)).sum();
        let others = in_flight - load(&mine.in_flight);
        let part = self
            .tenant_part(load(&mine.queued), &mine.tenant_queued, total_queued)
            .unwrap_or(total_window as f64 * load(&mine.queued) as f64 / total_queued as f64)
            as u64;
        // It keeps what it would use of its own window (see the module's
        // doc): beside QD 1024 readers that queued 60 MiB on the other
        // reactors, an NBD writer alone on its reactor, showing one piece at
        // a time, got 31% of its share (`writer_own_reactor`).
        let using = (load(&mine.queued) + load(&mine.in_flight)).min(load(&mine.window));
        // The others' IO in flight may exceed every window: windows shrink
        // while IO is out, and each reactor publishes on its own.
        Some(part.max(using).min(total_window.saturating_sub(others)))
    }

    /// A reactor's part of the windows with two or more tenants queued
    /// (None with fewer: then it is its part by bytes queued), from its
    /// queued bytes, `mine` of them per tenant. Each reactor's window goes
    /// to its tenants by their bytes queued there, each tenant's windows so
    /// summed to the reactors by its bytes queued on each, and an idle
    /// reactor's window to all by bytes queued.
    fn tenant_part(
        &self,
        own: u64,
        mine: &[AtomicU64; TENANT_SLOTS],
        total_queued: u64,
    ) -> Option<f64> {
        if !self.tenants.load(Ordering::Relaxed) {
            return None;
        }
        let (mut queued, mut windows, mut idle) = ([0.0; TENANT_SLOTS], [0.0; TENANT_SLOTS], 0.0);
        for p in &self.reactors {
            let (all, window) = (load(&p.queued), load(&p.window) as f64);
            if all == 0 {
                idle += window;
                continue;
            }
            for (s, q) in p.tenant_queued.iter().map(load).enumerate() {
                // Published one store at a time: a reader may see a
                // tenant's bytes before the reactor's total that holds them.
                queued[s] += q as f64;
                windows[s] += window * q.min(all) as f64 / all as f64;
            }
        }
        if queued.iter().filter(|&&q| q > 0.0).count() < 2 {
            return None;
        }
        let mut part = idle * own as f64 / total_queued as f64;
        for (s, q) in mine.iter().map(load).enumerate() {
            if q > 0 && queued[s] > 0.0 {
                part += windows[s] * q as f64 / queued[s];
            }
        }
        Some(part)
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
        assert_eq!(l.busy_reactors(), 2);
        l.publish(1, 1000, 0, 0);
        assert_eq!(l.busy_reactors(), 1, "nothing queued or in flight: idle");
        l.publish(7, 1, 1, 1);
    }

    #[test]
    fn tenants_on_their_own_reactors_keep_their_windows_at_any_depth() {
        let l = LinkWindow::new(3);
        // Tenant 0 on reactors 0 and 1 (deep queues), tenant 1 on 2 (a few
        // streamed pieces).
        l.publish(0, 1000, 64_000, 0);
        l.publish_tenants(0, [64_000, 0]);
        l.publish(1, 1000, 32_000, 0);
        l.publish_tenants(1, [32_000, 0]);
        l.publish(2, 600, 500, 0);
        l.publish_tenants(2, [0, 500]);
        assert_eq!(
            l.share(2),
            Some(600),
            "its own window, not 600 x 500 / 96500"
        );
        assert_eq!(l.share(0), Some(1333), "tenant 0's 2000, by its backlog");
        assert_eq!(l.share(1), Some(1000), "no less than its own window");
        // Both tenants on reactors 1 and 2: the deeper queue, the larger part.
        l.publish(2, 600, 16_500, 0);
        l.publish_tenants(2, [16_000, 500]);
        l.publish(1, 1000, 32_500, 0);
        l.publish_tenants(1, [32_000, 500]);
        let (a, b) = (l.share(0).unwrap_or(0), l.share(2).unwrap_or(0));
        assert!(a > 2 * b, "{a} vs {b}");
        // An idle reactor's window goes to the others.
        l.publish(1, 1000, 0, 0);
        l.publish_tenants(1, [0, 0]);
        // Every window handed out; reactor 2 keeps its own 600 (540 by its
        // bytes): what each takes is bounded by what the others hold.
        assert_eq!((l.share(0), l.share(2)), (Some(2060), Some(600)));
    }

    /// A writer's reactor shows a piece or two queued: beside a deep
    /// queue it keeps what it uses of its own window.
    #[test]
    fn a_reactor_keeps_what_it_uses_of_its_own_window() {
        let l = LinkWindow::new(2);
        l.publish(0, 1000, 64_000, 500);
        l.publish(1, 1000, 100, 300);
        assert_eq!(l.share(1), Some(400), "not 2000 x 100 / 64,100 = 3");
        l.publish(1, 1000, 5_000, 300);
        assert_eq!(l.share(1), Some(1000), "its own window at most");
        assert_eq!(l.share(0), Some(1700), "by bytes, in what reactor 1 leaves");
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
