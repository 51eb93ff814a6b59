//! The gates: what an IO waits for at its device besides the windows. The
//! devices' latency budgets ([`DeviceQos`]), their caps beside a light
//! tenant ([`DeviceGate`]) and `rate`'s per-device op limit
//! ([`DeviceOps`]), each shared by all reactors, and when a budget or cap
//! that held the last poll's IO frees.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{DeviceGate, DeviceOps, DeviceQos, IoKind, Mode};
use crate::Nanos;

pub(super) struct Gates {
    /// Devices' latency targets and budgets.
    pub qos: Option<Arc<DeviceQos>>,
    /// Devices' caps beside a light tenant (`auto` with tenants).
    gate: Option<Arc<DeviceGate>>,
    /// `rate`'s per-device op limit.
    ops: Option<Arc<DeviceOps>>,
    /// The last poll left IO waiting for device budget until then.
    pub wake: Option<Nanos>,
}

impl Gates {
    /// Gates with `ops` as the op limit, if configured; budgets and caps
    /// come when shared.
    pub fn new(ops: Option<Arc<DeviceOps>>) -> Gates {
        Gates {
            qos: None,
            gate: None,
            ops,
            wake: None,
        }
    }

    pub fn share_qos(&mut self, qos: Arc<DeviceQos>) {
        self.qos = Some(qos);
    }

    pub fn share_gate(&mut self, gate: Arc<DeviceGate>) {
        self.gate = Some(gate);
    }

    /// The next poll is due by `at`.
    fn wake_by(&mut self, at: Nanos) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// Device `d` has budget under its latency target (always, without one);
    /// if not, the next poll is due when it will.
    pub fn qos_ready(&mut self, d: usize, now: Nanos) -> bool {
        let Some(q) = &self.qos else { return true };
        let at = q.ready_at(d, now);
        if at <= now {
            return true;
        }
        self.wake_by(at);
        false
    }

    /// Device `d` has room under its cap, or no light tenant is about (see
    /// [`DeviceGate`]); if not, the next poll is due when the gate says
    /// (the IO that frees a slot may complete on another reactor), unless
    /// `ours_at_device`: this reactor has IOs at the device.
    /// Only heavy IOs ask.
    pub fn gate_ready(&mut self, d: usize, ours_at_device: bool, now: Nanos) -> bool {
        let Some(g) = &self.gate else { return true };
        match g.ready(d, now) {
            Ok(()) => true,
            // A configured cap frees only as IOs complete: while this
            // reactor has IOs at the device, their completions poll
            // again, and a timer would cut the reactor's gathering wait
            // short for nothing (and on a VM, arming one is an exit).
            Err(_) if g.configured(d) && ours_at_device => false,
            Err(at) => {
                self.wake_by(at);
                false
            }
        }
    }

    /// `rate` with a device op limit: takes one of device `d`'s op slots
    /// (Some(false): none is free). None: no limit applies.
    pub fn take_op(&self, mode: Mode, d: usize) -> Option<bool> {
        if mode != Mode::Rate {
            return None;
        }
        self.ops.as_ref().map(|ops| ops.try_take(d))
    }

    /// Every one of `devices` has used up its op slots (false without a
    /// limit).
    pub fn ops_exhausted(&self, devices: &VecDeque<usize>) -> bool {
        let Some(ops) = &self.ops else {
            return false;
        };
        devices.iter().all(|&d| ops.exhausted(d))
    }

    /// Tenant `t` released an IO to device `d` costing `cost` of its
    /// budget (`d`: None for an IO that bypassed the pacer, which charges
    /// none). `light`: the tenant is light (see `Tenants::light`).
    pub fn released(&self, t: usize, d: Option<(usize, f64)>, light: bool, now: Nanos) {
        if let (Some(q), Some((d, cost))) = (&self.qos, d) {
            q.charge(d, cost, now);
        }
        if let Some(g) = &self.gate {
            g.released(t, light, now);
        }
    }

    /// A released IO is at device `d`.
    pub fn arrive(&self, d: usize, now: Nanos) {
        if let Some(g) = &self.gate {
            g.arrive(d, now);
        }
    }

    /// Device `d` finished an IO after `latency_ns` at it.
    pub fn device_done(&self, d: usize, latency_ns: u64, now: Nanos) {
        if let Some(g) = &self.gate {
            g.completed(d, latency_ns, now);
        }
    }

    /// An IO of `kind` took `latency_ns` at device `d`: its budget learns.
    pub fn record(&self, d: usize, kind: IoKind, latency_ns: u64, now: Nanos) {
        if let Some(q) = &self.qos {
            q.record(d, kind, latency_ns, now);
        }
    }

    /// An IO still counted at device `d` landed with no device completion
    /// seen (cancelled there).
    pub fn leave(&self, d: usize) {
        if let Some(g) = &self.gate {
            g.leave(d);
        }
    }

    /// Tenant `t`'s IO landed; `took_op` at device `d`: its op slot frees.
    pub fn landed(&self, t: usize, d: usize, took_op: bool) {
        if let Some(g) = &self.gate {
            g.landed(t);
        }
        if took_op {
            if let Some(ops) = &self.ops {
                ops.give(d);
            }
        }
    }
}
