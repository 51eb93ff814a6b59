//! `rate` mode's per-device op limit, shared by every reactor's pacer.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Per-device IO-count limit shared by every reactor's pacer, so the limit is
/// exact across reactors: a slot is taken with compare-and-swap, never
/// overshooting.
#[derive(Debug)]
pub struct DeviceOps {
    limit: u32,
    in_flight: Vec<AtomicU32>,
}

impl DeviceOps {
    pub fn new(devices: usize, limit: u32) -> Arc<DeviceOps> {
        Arc::new(DeviceOps {
            limit,
            in_flight: (0..devices).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    pub(super) fn try_take(&self, device: usize) -> bool {
        let Some(c) = self.in_flight.get(device) else {
            return true;
        };
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            (v < self.limit).then_some(v + 1)
        })
        .is_ok()
    }

    pub(super) fn give(&self, device: usize) {
        if let Some(c) = self.in_flight.get(device) {
            let gave = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
            debug_assert!(
                gave.is_ok(),
                "device {device}: an op given back never taken"
            );
        }
    }

    /// Device `device` has no op slot free.
    pub fn exhausted(&self, device: usize) -> bool {
        self.in_flight(device) >= self.limit
    }

    pub fn in_flight(&self, device: usize) -> u32 {
        self.in_flight
            .get(device)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
}
