//! Each device's delivered rate, shared by every reactor's pacer and
//! split by where its flows wait.
//!
//! A reactor sizes its window at a device on the rate the device delivers
//! to it. Kept apart, that is a loop that feeds itself: a reactor whose
//! window is larger gets more of a drive that serves in order, its rate
//! grows, and so does its window, while another reactor's shrinks to its
//! floor. Fuzz case 1:79 (62 hosts on one drive over 4 reactors) ended with
//! one reactor at 22 Gb/s beside three at 3-4, its hosts at 12 times their
//! share and the others' at 1%. Summed over the reactors and split by the
//! flows each has waiting at the device, the rate gives every flow the
//! same part of the drive, whichever reactor serves it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::link_window::store_changed;
use super::DeviceNs;

#[derive(Debug)]
pub struct DeviceShares {
    reactors: usize,
    /// Device `d`, reactor `r` at `d * reactors + r`.
    parts: Box<[Part]>,
}

/// What one reactor publishes for one device; only that reactor writes it.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Part {
    /// The device time it delivers here a second (0: not measured).
    rate: AtomicU64,
    /// Flows with IO queued for it here.
    flows: AtomicU64,
    /// Its device time in flight here.
    in_flight: AtomicU64,
}

/// One reactor's view of a device over all reactors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// Its part of the device's rate, by the flows it has waiting.
    pub part: f64,
    /// The device's rate over all reactors.
    pub total: f64,
    /// The device time the other reactors have in flight there.
    pub others_in_flight: DeviceNs,
}

impl DeviceShares {
    pub fn new(devices: usize, reactors: usize) -> Arc<DeviceShares> {
        Arc::new(DeviceShares {
            reactors,
            parts: (0..devices * reactors).map(|_| Part::default()).collect(),
        })
    }

    fn part(&self, d: usize, r: usize) -> Option<&Part> {
        (r < self.reactors)
            .then(|| self.parts.get(d * self.reactors + r))
            .flatten()
    }

    /// Reactor `r` delivers `rate` of device `d`'s time a second, has
    /// `flows` flows waiting for it and `in_flight` of its time there.
    pub fn publish(&self, d: usize, r: usize, rate: f64, flows: usize, in_flight: DeviceNs) {
        let Some(p) = self.part(d, r) else { return };
        store_changed(&p.rate, rate as u64);
        store_changed(&p.flows, flows as u64);
        store_changed(&p.in_flight, in_flight.0);
    }

    /// Reactor `r`'s view of device `d` (None: it has no flow waiting
    /// there, or is not one of the reactors).
    pub fn split(&self, d: usize, r: usize) -> Option<Split> {
        let mine = self.part(d, r)?;
        let my_flows = mine.flows.load(Ordering::Relaxed);
        if my_flows == 0 {
            return None;
        }
        let parts = &self.parts[d * self.reactors..(d + 1) * self.reactors];
        let load = |f: fn(&Part) -> &AtomicU64| -> u64 {
            parts.iter().map(|p| f(p).load(Ordering::Relaxed)).sum()
        };
        let (flows, rate) = (load(|p| &p.flows), load(|p| &p.rate));
        Some(Split {
            part: rate as f64 * my_flows as f64 / flows as f64,
            total: rate as f64,
            others_in_flight: DeviceNs(
                load(|p| &p.in_flight) - mine.in_flight.load(Ordering::Relaxed),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_rate_is_split_by_the_flows_waiting_on_each_reactor() {
        let s = DeviceShares::new(2, 2);
        s.publish(0, 0, 900.0, 1, DeviceNs(10));
        s.publish(0, 1, 100.0, 3, DeviceNs(30));
        let split = |part, others_in_flight| Split {
            part,
            total: 1000.0,
            others_in_flight,
        };
        assert_eq!(s.split(0, 0), Some(split(250.0, DeviceNs(30))));
        assert_eq!(s.split(0, 1), Some(split(750.0, DeviceNs(10))));
        // Nothing waiting here, or not a reactor: no split.
        s.publish(1, 0, 50.0, 0, DeviceNs::ZERO);
        assert_eq!(s.split(1, 0), None);
        assert_eq!(s.split(0, 5), None);
    }
}
