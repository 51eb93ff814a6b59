//! The types every crate of iopace shares: time as the drivers supply it,
//! the kind of an IO, and the device cost model that both the pacer and the
//! devices (bdev, simulator, probe) speak.

use serde::Serialize;

mod cost;

pub use cost::CostModel;

/// Monotonic time in nanoseconds from an arbitrary origin, supplied by the driver.
pub type Nanos = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum IoKind {
    Read,
    Write,
}
