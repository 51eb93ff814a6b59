//! `auto`'s reactor window, summed from its hosts' (see
//! [`flows`](super::super::flows)). It is summed on every completion and
//! every poll; a poll right after a completion mostly finds nothing it
//! reads changed, so the sum is kept with what it was taken from and not
//! taken again.

use std::cell::Cell;

use super::super::drr::{Scheduler, FAST_HOLD_RATIO};
use super::super::flows::HOST_MIN_IOS;
use super::super::sizing::Floors;
use super::super::{Mode, PacingConfig};
use super::Windows;
use crate::Nanos;

/// A host's window floor grows with the reactors pooling it up to this
/// many of them (see `Windows::pooled_floor`).
const FLOOR_REACTORS: u64 = 4;

/// The network hosts active on all the reactors hold at least this many of
/// the largest IO between them (see [`flows`](super::super::flows)).
const SHARED_MIN_IOS: u64 = 8;

/// What a reactor window was summed from, besides the flows' books (which
/// say themselves when they change, `Flows::stale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::pacer) struct SumKey {
    max_io: u64,
    max_window: u64,
    latency: Option<Nanos>,
    fastest: Option<Nanos>,
    /// The ports' generation (see `PortMeter::generation`).
    ports: Option<u64>,
}

impl Windows {
    /// The key a sum taken now would be kept under. None when the sum
    /// reads what changes unseen: the other reactors' windows.
    fn sum_key(&self, cfg: &PacingConfig) -> Option<SumKey> {
        self.link.is_none().then(|| SumKey {
            max_io: self.max_io,
            max_window: cfg.max_window,
            latency: self.latency.get(),
            fastest: self.fastest.get(),
            ports: self.ports.as_ref().map(|m| m.generation()),
        })
    }

    /// `auto`'s window: the sum of its active hosts' windows (see
    /// [`flows`](super::super::flows)), at least four of the largest IO over all
    /// the reactors that pool their windows.
    pub fn resize(&mut self, cfg: &PacingConfig, sched: &Scheduler) {
        if cfg.mode != Mode::Auto {
            return;
        }
        let key = self.sum_key(cfg);
        if key.is_some() && key == self.sum_key && !self.flows.stale() {
            // Nothing the sum reads changed: `window` is what it would give
            // (the tests' debug builds sum again to check).
            debug_assert_eq!(self.sum(cfg, sched).0, self.window, "a kept sum");
            return;
        }
        let (w, on_full_port) = self.sum(cfg, sched);
        // A flow on a full port reads its device's hold time, which every
        // completion moves: such a sum is not kept.
        self.sum_key = key.filter(|_| !on_full_port);
        if self.flows.unpublished() {
            self.publish_hosts();
        }
        if w != self.window {
            self.window = w;
            self.publish_link(&sched.tenants);
        }
    }

    /// The reactor's window summed from its flows, and whether a flow is
    /// on a full port.
    fn sum(&mut self, cfg: &PacingConfig, sched: &Scheduler) -> (u64, bool) {
        let floors = Floors {
            host: self.pooled_floor(HOST_MIN_IOS),
            shared: self.spread_floor(SHARED_MIN_IOS),
        };
        // Only flows at fast devices pool: a slow device's flows are held
        // by their device's hold time, not by the port (pooled, fast
        // tenants beside 32 slow 1 ms drives held 14-16 MiB where they
        // had held 6, `tenants_slow_devices`).
        let (ports, devices, fastest) = (self.ports.as_ref(), &sched.devices, self.fastest.get());
        let fast = |d: usize| {
            devices
                .get(d)
                .is_some_and(|dev| dev.hold_ratio(fastest) < FAST_HOLD_RATIO)
        };
        let on_full_port = Cell::new(false);
        let weight = |t: usize| sched.tenants.iter().nth(t).map_or(1.0, |t| t.weight);
        let shared = |f, d| {
            let port = ports.and_then(|m| m.shared_port(f));
            on_full_port.set(on_full_port.get() || port.is_some());
            port.filter(|_| fast(d))
        };
        let w = self.flows.window_sum(floors, shared, weight);
        (self.clamp_window(cfg, w, 4), on_full_port.get())
    }

    /// A host's least window here: `ios` of the largest IO on each reactor
    /// that pools its windows (see
    /// [`LinkWindow`](super::super::LinkWindow)), up to `FLOOR_REACTORS`
    /// of them, spread over all of them. Pooled, per-reactor floors add up:
    /// 16 reactors held 8-10 MiB for links whose product is near 1 MiB. Up to
    /// 4 reactors they stay whole (smaller, they starve slow devices' flows
    /// beside fast ones, `mixed_sizes_slow`: 155 instead of 180 Gb/s).
    pub fn pooled_floor(&self, ios: u64) -> u64 {
        let reactors = self.link.as_ref().map_or(1, |(l, _)| l.reactors() as u64);
        ios * self.max_io * reactors.min(FLOOR_REACTORS) / reactors
    }

    /// `ios` of the largest IO spread over the reactors that have IO queued
    /// or in flight, so the whole target holds that many, however many
    /// reactors serve its hosts.
    pub fn spread_floor(&self, ios: u64) -> u64 {
        let busy = self.link.as_ref().map_or(1, |(l, _)| l.busy_reactors());
        ios * self.max_io / busy.max(1) as u64
    }

    /// A window of at least `min_ios` of the largest IO and at most
    /// `max_window` (unless that is smaller than the minimum).
    pub fn clamp_window(&self, cfg: &PacingConfig, w: u64, min_ios: u64) -> u64 {
        let min = min_ios * self.max_io;
        w.clamp(min, cfg.max_window.max(min))
    }
}
