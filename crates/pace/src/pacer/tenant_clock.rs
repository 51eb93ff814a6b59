//! Tenants' virtual time shared by every reactor's pacer, so weights hold
//! across reactors. Each connection lives on one reactor; without this, a
//! tenant whose connections sit on reactor 0 and one on reactor 1 would each
//! get their reactor's share, whatever their weights.
//!
//! A pacer charges the shared clock `cost / weight` for every IO it
//! releases, and holds a tenant back while it runs more than a slack ahead
//! of the slowest other tenant with IO queued anywhere. An idle tenant is
//! not waited for (work-conserving), and one waking from idle starts at the
//! busy tenants' time, so idleness earns no credit.
//!
//! Each pacer also publishes when each tenant's oldest IO on its reactor
//! whose flow may go arrived, so a tenant held to its share serves its
//! reactors oldest first instead of whichever polls first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct TenantClock {
    /// f64 bits: virtual time, cost units per unit of weight.
    vtime: Vec<AtomicU64>,
    queued: Vec<AtomicU64>,
    /// [tenant * reactors + reactor]: arrival (ns) of the tenant's oldest IO
    /// queued on that reactor whose flow may go; `NONE_QUEUED` if none.
    oldest: Vec<AtomicU64>,
    /// Per tenant and reactor, the devices it has IO queued at there, as
    /// bits `d % 64` (see `devices_elsewhere`).
    devices: Vec<AtomicU64>,
    /// Per tenant and reactor, the devices where its IO's flow may go
    /// there (bits `d % 64`, see `ready_elsewhere`).
    ready: Vec<AtomicU64>,
    reactors: usize,
}

/// Devices as the tenant clock's masks hold them: bits `d % 64`.
pub fn device_bits(devices: impl IntoIterator<Item = usize>) -> u64 {
    devices.into_iter().fold(0, |m, d| m | 1 << (d % 64))
}

/// Which of a tenant's per-reactor device masks (see `TenantClock`).
#[derive(Debug, Clone, Copy)]
pub enum DeviceMask {
    /// Devices it has IO queued at.
    Queued,
    /// Devices where its IO's flow may go: what it would take from a
    /// tenant that sends IO there (see `Pacer::others_ready`).
    Ready,
}

const NONE_QUEUED: u64 = u64::MAX;

impl TenantClock {
    pub fn new(tenants: usize) -> Arc<TenantClock> {
        TenantClock::with_reactors(tenants, 1)
    }

    /// A clock for `tenants` served by `reactors` pacers.
    pub fn with_reactors(tenants: usize, reactors: usize) -> Arc<TenantClock> {
        let (tenants, reactors) = (tenants.max(1), reactors.max(1));
        let atomics = |n: usize, v: u64| (0..n).map(|_| AtomicU64::new(v)).collect();
        Arc::new(TenantClock {
            vtime: atomics(tenants, 0),
            queued: atomics(tenants, 0),
            oldest: atomics(tenants * reactors, NONE_QUEUED),
            devices: atomics(tenants * reactors, 0),
            ready: atomics(tenants * reactors, 0),
            reactors,
        })
    }

    pub fn reactors(&self) -> usize {
        self.reactors
    }

    /// Tenant `t`'s oldest IO queued on `reactor` arrived `at` (None: it
    /// has none queued there).
    pub fn set_oldest(&self, t: usize, reactor: usize, at: Option<u64>) {
        if reactor < self.reactors {
            if let Some(o) = self.oldest.get(t * self.reactors + reactor) {
                // Published at every poll: write the shared line only when
                // the value changed.
                let v = at.unwrap_or(NONE_QUEUED);
                if o.load(Ordering::Relaxed) != v {
                    o.store(v, Ordering::Relaxed);
                }
            }
        }
    }

    fn masks(&self, kind: DeviceMask) -> &[AtomicU64] {
        match kind {
            DeviceMask::Queued => &self.devices,
            DeviceMask::Ready => &self.ready,
        }
    }

    /// Tenant `t`'s devices of `kind` on `reactor` are those of `mask`
    /// (bits `d % 64`).
    pub fn set_devices(&self, kind: DeviceMask, t: usize, reactor: usize, mask: u64) {
        if reactor < self.reactors {
            if let Some(m) = self.masks(kind).get(t * self.reactors + reactor) {
                // Published at every poll, as `set_oldest`.
                if m.load(Ordering::Relaxed) != mask {
                    m.store(mask, Ordering::Relaxed);
                }
            }
        }
    }

    /// Tenant `t`'s devices of `kind` (bits `d % 64`) on the reactors
    /// other than `reactor`.
    pub fn devices_elsewhere(&self, kind: DeviceMask, t: usize, reactor: usize) -> u64 {
        let masks = self.masks(kind);
        (0..self.reactors)
            .filter(|&r| r != reactor)
            .filter_map(|r| masks.get(t * self.reactors + r))
            .fold(0, |all, m| all | m.load(Ordering::Relaxed))
    }

    /// Tenant `t`'s oldest IO on `reactor` is no more than `tolerance` ns
    /// younger than its oldest on any other reactor.
    pub fn holds_oldest(&self, t: usize, reactor: usize, tolerance: u64) -> bool {
        let at = |r: usize| {
            self.oldest
                .get(t * self.reactors + r)
                .map_or(NONE_QUEUED, |o| o.load(Ordering::Relaxed))
        };
        let own = at(reactor);
        (0..self.reactors)
            .filter(|&r| r != reactor)
            .all(|r| own <= at(r).saturating_add(tolerance))
    }

    pub fn tenants(&self) -> usize {
        self.vtime.len()
    }

    pub fn vtime(&self, t: usize) -> f64 {
        self.vtime
            .get(t)
            .map_or(0.0, |v| f64::from_bits(v.load(Ordering::Relaxed)))
    }

    fn update(&self, t: usize, f: impl Fn(f64) -> f64) {
        if let Some(v) = self.vtime.get(t) {
            let _ = v.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
        }
    }

    /// Tenant `t` released IO costing `dv` of its virtual time.
    pub fn advance(&self, t: usize, dv: f64) {
        self.update(t, |v| v + dv);
    }

    /// One IO of tenant `t` was queued in some pacer. Waking, it may lag
    /// the busy tenants' least virtual time by at most `credit`.
    pub fn queued(&self, t: usize, credit: f64) {
        let Some(q) = self.queued.get(t) else { return };
        if q.fetch_add(1, Ordering::AcqRel) == 0 {
            self.lift_to(t, credit);
        }
    }

    /// Tenant `t` cannot take service now (its own links hold it): like a
    /// tenant waking from idle, it keeps no lead over the busy tenants'
    /// least virtual time, so it later claims no credit for the wait.
    pub fn lift(&self, t: usize) {
        self.lift_to(t, 0.0);
    }

    fn lift_to(&self, t: usize, credit: f64) {
        let floor = self.busy_min(t, |_| false);
        if floor.is_finite() {
            self.update(t, |v| v.max(floor - credit));
        }
    }

    /// One IO of tenant `t` left its queue (released or cancelled).
    pub fn dequeued(&self, t: usize) {
        if let Some(q) = self.queued.get(t) {
            let left = q.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
            debug_assert!(left.is_ok(), "tenant {t}: dequeued more than it queued");
        }
    }

    /// The least virtual time of the other tenants with IO queued, leaving
    /// out those `skip` names.
    fn busy_min(&self, t: usize, skip: impl Fn(usize) -> bool) -> f64 {
        (0..self.tenants())
            .filter(|&u| u != t && !skip(u) && self.queued[u].load(Ordering::Acquire) > 0)
            .map(|u| self.vtime(u))
            .fold(f64::INFINITY, f64::min)
    }

    /// How far tenant `t` runs ahead of the slowest other busy tenant,
    /// leaving out those `skip` names (0 when no such tenant is busy).
    pub fn lead(&self, t: usize, skip: impl Fn(usize) -> bool) -> f64 {
        let floor = self.busy_min(t, skip);
        if floor.is_finite() {
            (self.vtime(t) - floor).max(0.0)
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reactor_with_the_oldest_io_is_served_first() {
        let c = TenantClock::with_reactors(2, 3);
        c.set_oldest(1, 0, Some(5_000));
        c.set_oldest(1, 1, Some(1_000));
        assert!(!c.holds_oldest(1, 0, 1_000), "reactor 1 waited 4 us longer");
        assert!(c.holds_oldest(1, 0, 4_000), "within the tolerance");
        assert!(c.holds_oldest(1, 1, 0));
        c.set_oldest(1, 1, None);
        assert!(c.holds_oldest(1, 0, 0), "reactor 1 has none queued now");
        assert!(c.holds_oldest(0, 2, 0), "tenant 0 queued nowhere");
        c.set_oldest(1, 9, Some(0)); // an unknown reactor is ignored
        assert!(c.holds_oldest(1, 0, 0));
    }

    #[test]
    fn a_tenants_devices_elsewhere_are_those_other_reactors_published() {
        let c = TenantClock::with_reactors(2, 3);
        let q = DeviceMask::Queued;
        c.set_devices(q, 1, 0, 0b0011);
        c.set_devices(q, 1, 2, 0b1000);
        assert_eq!(c.devices_elsewhere(q, 1, 0), 0b1000);
        assert_eq!(c.devices_elsewhere(q, 1, 1), 0b1011);
        c.set_devices(q, 1, 2, 0);
        assert_eq!(
            c.devices_elsewhere(q, 1, 1),
            0b0011,
            "reactor 2 has none queued now"
        );
        assert_eq!(c.devices_elsewhere(q, 0, 1), 0);
        c.set_devices(q, 1, 9, u64::MAX); // an unknown reactor is ignored
        assert_eq!(c.devices_elsewhere(q, 1, 1), 0b0011);
        // The masks of each kind are apart.
        c.set_devices(DeviceMask::Ready, 1, 0, 0b0100);
        assert_eq!(c.devices_elsewhere(DeviceMask::Ready, 1, 1), 0b0100);
        assert_eq!(c.devices_elsewhere(q, 1, 1), 0b0011);
    }

    #[test]
    fn lead_counts_only_busy_tenants_and_waking_tenants_start_level() {
        let c = TenantClock::new(2);
        c.queued(0, 0.0);
        c.advance(0, 100.0);
        // Tenant 1 is idle: tenant 0 leads nobody.
        assert_eq!(c.lead(0, |_| false), 0.0);
        c.queued(1, 0.0);
        // Tenant 1 woke at tenant 0's time, not at 0.
        assert_eq!(c.vtime(1), 100.0);
        c.advance(0, 50.0);
        assert_eq!(c.lead(0, |_| false), 50.0);
        assert_eq!(c.lead(1, |_| false), 0.0);
        assert_eq!(
            c.lead(0, |u| u == 1),
            0.0,
            "a skipped tenant is not waited for"
        );
        c.dequeued(1);
        assert_eq!(c.lead(0, |_| false), 0.0);
        // Out-of-range tenants are ignored, not a panic.
        c.queued(9, 0.0);
        c.dequeued(9);
        c.advance(9, 1.0);
    }

    /// A tenant that queues again with IO in flight keeps up to its credit
    /// of lag behind the busy tenants; no more, and never a lead it lacked.
    #[test]
    fn waking_with_credit_keeps_bounded_lag() {
        let c = TenantClock::new(2);
        c.queued(0, 0.0);
        c.advance(0, 1000.0);
        c.queued(1, 300.0);
        assert_eq!(c.vtime(1), 700.0, "lifted to 1000 less its credit");
        c.dequeued(1);
        c.advance(1, 900.0);
        c.queued(1, 300.0);
        assert_eq!(c.vtime(1), 1600.0, "ahead already: not moved back");
    }
}
