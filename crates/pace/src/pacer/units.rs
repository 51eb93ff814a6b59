//! Units that meet in the pacer and must not be mixed up: bytes (`u64`),
//! wall-clock time ([`Nanos`](crate::Nanos)) and device time by a cost
//! model ([`DeviceNs`]). A device's window, its delivered rate and each
//! tenant's part of it count device time: what an IO costs the device,
//! not how long it took (which includes its wait there) nor its size.

use std::ops::{Add, AddAssign, Mul, Sub, SubAssign};

use crate::Nanos;

/// Device time by a device's cost model, in nanoseconds of one channel.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceNs(pub u64);

impl DeviceNs {
    pub const ZERO: DeviceNs = DeviceNs(0);

    /// For rates and means, which the estimators keep as floats.
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }

    /// The wall time one channel takes to serve it: where a device's
    /// measured times (waits, holds) meet its cost model.
    pub fn service_ns(self) -> Nanos {
        self.0
    }

    /// From a product worked out in floats (rate x time), rounded down.
    pub fn from_f64(ns: f64) -> DeviceNs {
        DeviceNs(ns as u64)
    }
}

impl Add for DeviceNs {
    type Output = DeviceNs;
    fn add(self, other: DeviceNs) -> DeviceNs {
        DeviceNs(self.0 + other.0)
    }
}

impl AddAssign for DeviceNs {
    fn add_assign(&mut self, other: DeviceNs) {
        self.0 += other.0;
    }
}

/// No device time may be taken that was not there.
impl Sub for DeviceNs {
    type Output = DeviceNs;
    fn sub(self, other: DeviceNs) -> DeviceNs {
        debug_assert!(self >= other, "{other:?} taken from {self:?}");
        DeviceNs(self.0 - other.0)
    }
}

impl SubAssign for DeviceNs {
    fn sub_assign(&mut self, other: DeviceNs) {
        *self = *self - other;
    }
}

/// `n` IOs of this device time.
impl Mul<DeviceNs> for u64 {
    type Output = DeviceNs;
    fn mul(self, ns: DeviceNs) -> DeviceNs {
        DeviceNs(self * ns.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_time_adds_and_scales_as_its_nanoseconds() {
        let a = DeviceNs(7_700);
        assert_eq!(a + DeviceNs(300), DeviceNs(8_000));
        assert_eq!(2 * a, DeviceNs(15_400));
        assert_eq!(DeviceNs::from_f64(1.9e3), DeviceNs(1_900));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic]
    fn taking_more_device_time_than_there_is_panics() {
        let _ = DeviceNs(1) - DeviceNs(2);
    }
}
