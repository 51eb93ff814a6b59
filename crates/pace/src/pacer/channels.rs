//! Each device's channel as the cost model sees it, shared by every
//! reactor's pacer: when the IOs released to it so far will have been
//! served. A drive serves its IOs in arrival order, so a light tenant's
//! (QD 1) IO waits for every heavy IO already there, and each reactor
//! keeps its own heavy IOs at every device (its device window's floor is
//! 2 IOs). While a light tenant is about, heavy IOs go to a device only
//! when its channel is about to be free, whichever reactor released the
//! IOs ahead: the light IO then finds at most the one in service. A
//! tenant is light here when it has nothing in flight on any reactor (a
//! tenant streaming on two reactors may have none on one of them), twice
//! running: every tenant's first IO, and the first after an idle spell,
//! finds none in flight, and heavy tenants start that way.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::Nanos;

/// How long after a light tenant's last IO the channels stay guarded: a
/// QD 1 client's next IO comes one round trip later, and a client that
/// paused for longer than this finds the usual queues.
const LIGHT_GUARD_NS: Nanos = 10_000_000;

/// Per-device channel clocks and when a light tenant last released.
#[derive(Debug)]
pub struct DeviceChannels {
    /// When each device's channel is next free, by the cost model.
    free_at: Vec<AtomicU64>,
    /// When a light tenant's IO was last released (0: never).
    light_at: AtomicU64,
    /// Each tenant's IOs in flight on every reactor.
    in_flight: Vec<AtomicU32>,
    /// Each tenant's last release found it light.
    was_light: Vec<AtomicBool>,
}

impl DeviceChannels {
    pub fn new(devices: usize, tenants: usize) -> Arc<DeviceChannels> {
        Arc::new(DeviceChannels {
            free_at: (0..devices).map(|_| AtomicU64::new(0)).collect(),
            light_at: AtomicU64::new(0),
            in_flight: (0..tenants).map(|_| AtomicU32::new(0)).collect(),
            was_light: (0..tenants).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Tenant `t` released an IO at `now`; `light` is whether it is light
    /// on this reactor (see `Pacer::light`). It is light for the channels
    /// when it had nothing in flight on any reactor either, at this
    /// release and its last.
    pub(super) fn released(&self, t: usize, light: bool, now: Nanos) {
        let (Some(c), Some(was)) = (self.in_flight.get(t), self.was_light.get(t)) else {
            return;
        };
        let light = c.fetch_add(1, Ordering::AcqRel) == 0 && light;
        if was.swap(light, Ordering::AcqRel) && light {
            self.light_at.fetch_max(now, Ordering::AcqRel);
        }
    }

    /// One of tenant `t`'s IOs left flight.
    pub(super) fn landed(&self, t: usize) {
        if let Some(c) = self.in_flight.get(t) {
            let gave = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
            debug_assert!(gave.is_ok(), "tenant {t}: lands more than it released");
        }
    }

    /// An IO costing `cost` ns of device time goes to device `d` at `now`:
    /// it is served after everything released to it before.
    pub(super) fn charge(&self, d: usize, cost: f64, now: Nanos) {
        if let Some(c) = self.free_at.get(d) {
            let cost = cost as Nanos;
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                Some(f.max(now) + cost)
            });
        }
    }

    /// How long device `d`'s channel stays busy with what is released to it.
    pub(super) fn backlog(&self, d: usize, now: Nanos) -> Nanos {
        self.free_at
            .get(d)
            .map_or(0, |c| c.load(Ordering::Acquire).max(now) - now)
    }

    /// A light tenant released within the guard: heavy IOs wait for the
    /// channels. (Another reactor's `now` may be a little ahead of ours.)
    pub(super) fn guarding(&self, now: Nanos) -> bool {
        let at = self.light_at.load(Ordering::Acquire);
        at > 0 && at + LIGHT_GUARD_NS > now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_serves_what_every_reactor_released_in_turn() {
        let c = DeviceChannels::new(2, 2);
        c.charge(0, 50_000.0, 1_000);
        c.charge(0, 50_000.0, 2_000);
        assert_eq!(c.backlog(0, 1_000), 100_000);
        assert_eq!(c.backlog(1, 1_000), 0);
        assert_eq!(c.backlog(0, 200_000), 0, "idle since 101 us");
        c.charge(0, 10_000.0, 200_000);
        assert_eq!(c.backlog(0, 200_000), 10_000);
        assert!(!c.guarding(200_000));
        c.released(1, false, 200_000);
        assert!(!c.guarding(200_000), "tenant 1 is not light");
        c.released(0, true, 100_000);
        assert!(!c.guarding(100_000), "a first IO");
        c.released(0, true, 150_000);
        assert!(!c.guarding(150_000), "one IO in flight already");
        c.landed(0);
        c.landed(0);
        c.released(0, true, 160_000);
        assert!(!c.guarding(160_000), "the last release was not light");
        c.landed(0);
        c.released(0, true, 200_000);
        assert!(c.guarding(200_000 + LIGHT_GUARD_NS - 1));
        assert!(!c.guarding(200_000 + LIGHT_GUARD_NS));
    }
}
