//! Each tenant's part of a device it shares, in device time at the device.
//!
//! A drive serves what it holds in order, or nearly: each tenant then gets
//! of its rate what it has of its queue. When the window the drive's rate
//! needs is deeper than the tenants' IOs together, the pacer holds none of
//! them, and its order gives no weights: gold 2 and bronze 1 at QD 32 each
//! on this machine's disk split 1.00-1.08 : 1. So a tenant may have at the
//! device only its weight's part of what the others have there: bronze
//! half of gold's, wherever the window stands.
//!
//! A tenant that its queue depth holds under its share even at the
//! device's least latency (a QD 1 client) sets no part for the others: it
//! takes all it can and they divide the rest. It is not held either.
//!
//! A tenant's demand is what it had at the device on the mean over the
//! last `CLIENT_PAUSE_NS` or so, plus what it has queued for it: a
//! client's IOs come back in bursts, and between them the other tenant
//! filled the device (on this machine's disk gold at QD 32 at times had
//! one IO there, bronze 30). Its most in that span was too much: gold's
//! IOs are away at the client part of the time, and bronze, held to half
//! of gold's most, had 1.5-1.6 of its half of the disk.

use super::device_gate::CLIENT_PAUSE_NS;
use super::DeviceNs;
use crate::Nanos;

/// Each tenant's device time at one device, and its mean there.
#[derive(Debug, Default, Clone)]
pub(super) struct TenantLoads {
    loads: Vec<Load>,
    /// The last time IO came to or left the device.
    now: Nanos,
}

#[derive(Debug, Default, Clone, Copy)]
struct Load {
    at_device: DeviceNs,
    /// The mean of `at_device` over about `CLIENT_PAUSE_NS`, as of
    /// `changed`, when `at_device` last changed.
    mean: f64,
    changed: Nanos,
}

impl Load {
    /// The mean as of `now`: `at_device` has held since `changed`. A
    /// cancel's leave is timed at the device's last event, which may be a
    /// little after another reactor-clock reading: an earlier `now` adds
    /// nothing.
    fn mean_at(&self, now: Nanos) -> f64 {
        let held = now.max(self.changed) - self.changed;
        let part = (held as f64 / CLIENT_PAUSE_NS as f64).min(1.0);
        self.mean + (self.at_device.as_f64() - self.mean) * part
    }

    fn settle(&mut self, now: Nanos) {
        self.mean = self.mean_at(now);
        self.changed = self.changed.max(now);
    }
}

impl TenantLoads {
    /// Tenant `t`'s IO of `work` went to the device at `now`.
    pub fn arrive(&mut self, t: usize, work: DeviceNs, now: Nanos) {
        if self.loads.len() <= t {
            self.loads.resize(t + 1, Load::default());
        }
        self.now = self.now.max(now);
        let l = &mut self.loads[t];
        l.settle(now);
        l.at_device += work;
    }

    /// Tenant `t`'s IO of `work` left the device at `now` (None: when IO
    /// last came or left).
    pub fn leave(&mut self, t: usize, work: DeviceNs, now: Option<Nanos>) {
        let now = now.map_or(self.now, |n| n.max(self.now));
        self.now = now;
        let l = self.loads.get_mut(t);
        debug_assert!(
            l.as_ref().is_some_and(|l| l.at_device >= work),
            "tenant {t} leaves a device with more than it had there"
        );
        if let Some(l) = l {
            l.settle(now);
            l.at_device -= work;
        }
    }

    /// Tenant `t`'s device time at the device.
    pub fn at_device(&self, t: usize) -> DeviceNs {
        self.loads.get(t).map_or(DeviceNs::ZERO, |l| l.at_device)
    }

    /// Tenant `t`'s device time at the device on the recent mean.
    pub fn mean(&self, t: usize) -> f64 {
        self.loads.get(t).map_or(0.0, |l| l.mean_at(self.now))
    }

    /// How many tenants have been seen at the device.
    pub fn len(&self) -> usize {
        self.loads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacer::drr::Device;
    use crate::pacer::{CostModel, PacedIo};

    const MS: u64 = 1_000_000;

    /// A device whose rate and least latency are known: it delivers one
    /// second of device time a second, each IO at least 100 us at it.
    fn device() -> Device {
        let mut dev = Device::new(CostModel::default(), 4096);
        dev.rate.offer(0, 0, 0);
        dev.rate.offer(100 * MS, 100 * MS, 0);
        dev.device_latency.update(100_000, MS);
        dev
    }

    fn queue(dev: &mut Device, tenant: usize, work: DeviceNs, n: usize) {
        for i in 0..n {
            let io = PacedIo::read_4k((tenant * 1000 + i) as u64, tenant as u64, tenant);
            dev.queue.push(io, 0, work);
        }
    }

    fn weight(t: usize) -> f64 {
        [2.0, 1.0][t]
    }

    /// Gold (2) and bronze (1) with 32 IOs each: bronze holds at the
    /// device half of gold's demand, gold is never held by bronze.
    #[test]
    fn a_tenant_has_at_the_device_its_weights_part_of_the_others() {
        let mut dev = device();
        let work = DeviceNs(20_000);
        (0..32).for_each(|_| dev.arrive(work, 0, 0));
        (0..15).for_each(|_| dev.arrive(work, 1, 0));
        queue(&mut dev, 1, work, 17);
        // A span later, gold's mean is its 32.
        dev.leave(work, 1, Some(CLIENT_PAUSE_NS));
        dev.arrive(work, 1, CLIENT_PAUSE_NS);
        assert!(dev.tenant_part_open(weight, 1), "the 16th fits");
        dev.arrive(work, 1, CLIENT_PAUSE_NS);
        assert!(!dev.tenant_part_open(weight, 1), "the 17th does not");
        queue(&mut dev, 0, work, 8);
        assert!(dev.tenant_part_open(weight, 0), "gold goes on");
    }

    /// A tenant's demand is its mean at the device: gold's IOs away at its
    /// client half the time count half.
    #[test]
    fn a_demand_is_the_mean_at_the_device() {
        let mut dev = device();
        let work = DeviceNs(20_000);
        (0..32).for_each(|_| dev.arrive(work, 0, 0));
        (0..31).for_each(|_| dev.arrive(work, 1, 0));
        let half = CLIENT_PAUSE_NS / 2;
        (0..32).for_each(|_| dev.leave(work, 0, Some(half)));
        assert!((dev.tenants.mean(0) - 16.0 * work.as_f64()).abs() < 1.0);
        dev.arrive(work, 0, half);
        queue(&mut dev, 1, work, 1);
        // Half of gold's 16 and its one IO at the device.
        assert!(!dev.tenant_part_open(weight, 1), "bronze over half of gold");
        (0..24).for_each(|_| dev.leave(work, 1, Some(half)));
        assert!(dev.tenant_part_open(weight, 1), "bronze under 8");
    }

    /// A QD 1 tenant (20 us of demand, under its 67 us share at the least
    /// latency) sets no part: bronze fills the device.
    #[test]
    fn a_tenant_its_depth_holds_sets_no_part() {
        let mut dev = device();
        let work = DeviceNs(20_000);
        dev.arrive(work, 0, 0);
        (0..31).for_each(|_| dev.arrive(work, 1, 0));
        queue(&mut dev, 1, work, 1);
        dev.leave(work, 1, Some(CLIENT_PAUSE_NS));
        dev.arrive(work, 1, CLIENT_PAUSE_NS);
        assert!(dev.tenant_part_open(weight, 1));
        // Unmeasured, nothing is held.
        let mut fresh = Device::new(CostModel::default(), 4096);
        fresh.arrive(work, 0, 0);
        fresh.arrive(work, 1, 0);
        assert!(fresh.tenant_part_open(weight, 1));
    }
}
