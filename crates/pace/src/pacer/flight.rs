//! A released IO while it is counted in flight: where it is relative to
//! its device, and what its release charged.

use super::{DeviceNs, IoKind};
use crate::Nanos;

/// Where a released IO is relative to its device: only IO at the device
/// counts against the device's window, so replies waiting for a slow wire
/// (or a write's payload waiting for a slow sender) hold their flow's
/// window, not the device's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeviceStage {
    /// A write piece whose payload is still arriving.
    Before,
    At,
    /// The device is done; the data may still be leaving.
    After,
}

/// A released IO still counted in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flight {
    pub(super) flow: u64,
    pub(super) kind: IoKind,
    pub(super) stage: DeviceStage,
    pub(super) device: usize,
    pub(super) tenant: usize,
    pub(super) bytes: u64,
    /// Its device time (see `Device::work`).
    pub(super) work: DeviceNs,
    pub(super) released_at: Nanos,
    pub(super) took_op: bool,
    /// What it counts against the shared window (see `link_share`).
    pub(super) paced: u64,
    /// How long its device took (0 until it did).
    pub(super) at_device: Nanos,
    /// Its client had nothing else queued or in flight.
    pub(super) lone: bool,
}

impl Flight {
    /// Before the device, at it, after it: in that order, once each. A
    /// double start or a double completion fails the assertion, in
    /// release builds too: the device's books would be wrong from then on.
    pub(super) fn enter(&mut self, to: DeviceStage) -> bool {
        use DeviceStage::*;
        let next = matches!((self.stage, to), (Before, At) | (At, After));
        assert!(next, "IO at its device: {:?} -> {to:?}", self.stage);
        if next {
            self.stage = to;
        }
        next
    }
}
