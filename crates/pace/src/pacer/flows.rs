//! Flows: each connection drains at its own rate (its socket, its host's
//! link), so `auto` admits each flow's IO only as fast as that flow drains.
//!
//! A flow's window is near its bandwidth-delay product: gain x (max rate
//! its own completions delivered) x (the reactor's min latency), and at
//! least `FLOW_MIN_IOS` of the largest IO. A reactor's window is the sum of
//! its active flows' bandwidth-delay products, floors left out: a flow that
//! needs less than its floor (a host behind a slow device) uses its floor
//! from what fast flows leave, not a window of its own that would let it
//! past the other tenants' weights, and many small flows do not add up
//! their floors. Replies queued for a slow host then fill only
//! that host's window, and a fast host's IO never waits behind them; a flow
//! that stops draining (a stalled client) holds its own window and nothing
//! more.

use std::collections::HashMap;

use super::auto_window::{rate_filter, PROBE_EVERY, PROBE_GAIN, RATE_SAMPLE_NS};
use super::filter::WindowedMax;
use crate::Nanos;

/// A flow's window holds at least this many of the largest IO: one being
/// sent while the next is read from the device.
const FLOW_MIN_IOS: u64 = 2;
/// A new flow starts with this many IOs of window, and grows from there as
/// its completions show the rate.
const FLOW_START_IOS: u64 = 4;

#[derive(Debug, Clone)]
struct Flow {
    queued: usize,
    in_flight: u64,
    delivered: u64,
    rate: WindowedMax,
    window: u64,
    /// gain x rate x latency, without the floor (None until measured).
    bdp: Option<u64>,
    samples: u64,
}

/// What the window formula needs from the pacer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    pub gain: f64,
    pub max_io: u64,
    pub max_window: u64,
    /// The reactor's min release-to-done latency, if measured.
    pub latency: Option<Nanos>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Flows {
    map: HashMap<u64, Flow>,
}

impl Flows {
    fn flow(&mut self, flow: u64, max_io: u64) -> &mut Flow {
        self.map.entry(flow).or_insert_with(|| Flow {
            queued: 0,
            in_flight: 0,
            delivered: 0,
            rate: rate_filter(max_io),
            window: FLOW_START_IOS * max_io,
            bdp: None,
            samples: 0,
        })
    }

    /// One IO of `flow` was queued.
    pub fn queued(&mut self, flow: u64, max_io: u64) {
        self.flow(flow, max_io).queued += 1;
    }

    /// One queued IO of `flow` left its queue without release (cancelled).
    pub fn unqueued(&mut self, flow: u64) {
        if let Some(f) = self.map.get_mut(&flow) {
            debug_assert!(f.queued > 0, "flow {flow}: cancel of an IO never queued");
            f.queued -= 1;
        }
    }

    /// One IO of `flow`, `bytes` long, was released.
    pub fn released(&mut self, flow: u64, bytes: u64) {
        if let Some(f) = self.map.get_mut(&flow) {
            debug_assert!(f.queued > 0, "flow {flow}: release of an IO never queued");
            f.queued -= 1;
            f.in_flight += bytes;
        }
    }

    /// A released IO of `flow` left the flight (done or cancelled).
    pub fn landed(&mut self, flow: u64, bytes: u64) {
        if let Some(f) = self.map.get_mut(&flow) {
            debug_assert!(
                f.in_flight >= bytes,
                "flow {flow}: landed more than it held"
            );
            f.in_flight -= bytes;
        }
    }

    /// A released IO's data has left (after `landed`): the flow's rate
    /// and window learn it.
    pub fn delivered(&mut self, flow: u64, bytes: u64, now: Nanos, sizing: Sizing) {
        let Some(f) = self.map.get_mut(&flow) else {
            return;
        };
        f.delivered += bytes;
        if !f.rate.offer(now, f.delivered, RATE_SAMPLE_NS) {
            return;
        }
        f.samples += 1;
        if let (Some(r), Some(l)) = (f.rate.get(), sizing.latency) {
            // As the reactor's window: one sample in PROBE_EVERY admits a
            // little more, to find a rate that has grown.
            let probe = if f.samples.is_multiple_of(PROBE_EVERY) {
                PROBE_GAIN
            } else {
                1.0
            };
            let w = (sizing.gain * probe * r * l as f64 / 1e9) as u64;
            let min = FLOW_MIN_IOS * sizing.max_io;
            f.window = w.clamp(min, sizing.max_window.max(min));
            f.bdp = Some(w.min(sizing.max_window));
        }
    }

    /// `flow` may release one more IO of `bytes`: its window has room, or
    /// it has nothing in flight.
    pub fn open(&self, flow: u64, bytes: u64) -> bool {
        self.map
            .get(&flow)
            .is_none_or(|f| f.in_flight == 0 || f.in_flight + bytes <= f.window)
    }

    /// The sum of the bandwidth-delay products of the flows with IO queued
    /// or in flight (a flow not yet measured counts its window).
    pub fn window_sum(&self) -> u64 {
        self.map
            .values()
            .filter(|f| f.queued > 0 || f.in_flight > 0)
            .map(|f| f.bdp.unwrap_or(f.window))
            .sum()
    }

    /// Forgets `flow` (its connection closed, its IOs cancelled before).
    pub fn close(&mut self, flow: u64) {
        if let Some(f) = self.map.remove(&flow) {
            debug_assert!(
                f.queued == 0 && f.in_flight == 0,
                "flow {flow} closed with IO still queued or in flight"
            );
        }
    }
}
