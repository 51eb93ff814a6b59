//! Devices within a tenant share its turns by deficit round robin, each
//! IO charged by its bytes times how long its device holds buffers; in
//! `auto`, fast devices serve their turns oldest IO first (see
//! `turn_server`). A device that cannot go passes its turn on.

use super::ablate::{self, Mechanism};
use super::drain_probe::DrainProbe;
use super::filter::{rate_filter, LargeIoMin, WindowedMax, WindowedMin, LATENCY_WINDOW_NS};
use super::queues::{DeviceQueue, Slot};
use super::{CostModel, IoKind, Mode, PacedIo, Pacer, Verdict};
use crate::Nanos;

#[derive(Debug, Default, Clone)]
pub(super) struct Device {
    pub queue: DeviceQueue,
    pub deficit: i64,
    /// Device time (ns, by its cost model) of the IOs at it: what its
    /// window bounds.
    pub in_flight_work: u64,
    pub in_flight_ios: u32,
    pub delivered: u64,
    /// Device time of the IOs it delivered, and its rate (ns a second).
    pub delivered_work: u64,
    pub rate: WindowedMax,
    pub latency: LargeIoMin,
    /// Min time at the device alone (submit to device completion).
    pub device_latency: WindowedMin,
    pub cost: CostModel,
    pub last_offset: u64,
    /// `auto`: a client sending one IO at a time holds this device's
    /// windows at depth 1 (see [`depth`](super::depth)).
    pub held: bool,
    /// How long IOs wait at the device beyond their own service (time at
    /// the device less their device time): the least (its fixed latency)
    /// and a moving mean (see `queues_at_device`).
    pub wait_min: WindowedMin,
    pub wait_mean: Option<f64>,
    /// The device's latency alone (see [`DrainProbe`]).
    pub probe: DrainProbe,
    /// The largest IO sent to it (bytes; 0 before the first).
    pub largest_io: u64,
}

impl Device {
    /// A device with no IO yet, whose IOs cost what `cost` says; its rate
    /// samples span at least as much device time as `RATE_SAMPLE_IOS` of
    /// the largest IO.
    pub fn new(cost: CostModel, max_io: u64) -> Device {
        let mut d = Device {
            cost,
            latency: LargeIoMin::new(LATENCY_WINDOW_NS),
            device_latency: WindowedMin::new(LATENCY_WINDOW_NS),
            wait_min: WindowedMin::new(LATENCY_WINDOW_NS),
            ..Device::default()
        };
        d.rate = rate_filter(d.largest_work(max_io));
        d
    }

    /// An IO taking `work` of device time is at the device.
    pub fn arrive(&mut self, work: u64) {
        self.in_flight_work += work;
        self.in_flight_ios += 1;
    }

    /// An IO taking `work` of device time left the device.
    pub fn leave(&mut self, work: u64) {
        debug_assert!(
            self.in_flight_ios > 0 && self.in_flight_work >= work,
            "a device lands more than it has in flight"
        );
        self.in_flight_work -= work;
        self.in_flight_ios -= 1;
    }

    /// An IO of `work` device time spent `at_device` at the device.
    pub fn note_wait(&mut self, at_device: Nanos, work: u64, now: Nanos) {
        // A cost model that overrates the device gives a service longer
        // than the IO took: it waited nothing.
        let wait = at_device.saturating_sub(work);
        self.wait_min.update(wait.max(1), now);
        let mean = self.wait_mean.get_or_insert(wait as f64);
        *mean += (wait as f64 - *mean) * WAIT_WEIGHT;
    }

    /// The device keeps a queue of its own: its IOs wait, on the moving
    /// mean, more than one IO of `largest_work` beyond twice its fixed
    /// latency. The device itself then bounds its IOs, not the links or
    /// the windows.
    pub fn queues_at_device(&self, largest_work: u64) -> bool {
        if ablate::out(Mechanism::DeviceQueue) {
            return false;
        }
        match (self.wait_mean, self.wait_min.get()) {
            (Some(mean), Some(min)) => mean > (2 * min + largest_work) as f64,
            _ => false,
        }
    }

    /// The device time an IO takes, by the device's cost model: its
    /// window counts this, not bytes, so small IOs (each costing the
    /// device a fixed time on top of its bytes) cannot crowd a busy
    /// device past what the window means.
    pub fn work(&self, kind: IoKind, bytes: u64) -> u64 {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        (self.cost.cost(kind, bytes, false).ceil() as u64).max(1)
    }

    /// The device time of the costlier of a read and a write of `bytes`.
    pub fn largest_work(&self, bytes: u64) -> u64 {
        self.work(IoKind::Read, bytes)
            .max(self.work(IoKind::Write, bytes))
    }
}

/// Each IO's wait at its device moves the device's mean wait by this part
/// of the difference.
const WAIT_WEIGHT: f64 = 1.0 / 16.0;

/// Past this wait in the pacer, a device's DRR debt is forgiven, so a slow
/// device's share bounds its IOs' waits instead of starving them.
pub(super) const MAX_PACER_WAIT_NS: Nanos = 100_000_000;

/// Devices holding buffers under this many times the fastest's time share
/// DRR turns oldest IO first (see `turn_server`).
pub(super) const FAST_HOLD_RATIO: f64 = 2.0;

impl Pacer {
    /// The device whose DRR turn it is for tenant `t`; devices left with
    /// no IO of `t` leave the rotation first.
    pub(super) fn front_device(&mut self, t: usize) -> Option<usize> {
        loop {
            let front = self.tenants[t].active.front().copied()?;
            if self.devices[front].queue.has(t) {
                return Some(front);
            }
            self.tenants[t].active.pop_front();
        }
    }

    /// Which device serves tenant `t`'s turn at `front`, and the position of
    /// its IO there. In `auto`, a fast device's turn goes to the fast device
    /// (one holding buffers under twice the fastest's time) whose oldest IO
    /// of this tenant has waited longest and that may take it now: fast
    /// devices then drain as one FIFO queue. With turns kept per device,
    /// random arrivals leave some queues much deeper than others while each
    /// gets the same rate, and their IOs wait several times longer. Slow
    /// devices keep their own turns and charges.
    pub(super) fn turn_server(
        &mut self,
        t: usize,
        front: usize,
        now: Nanos,
    ) -> Option<(usize, Slot)> {
        let front_slot = self.head(front, t);
        if self.cfg.mode != Mode::Auto || self.hold_ratio(front) >= FAST_HOLD_RATIO {
            return front_slot.map(|s| (front, s));
        }
        let mut best = (front_slot.map(|s| (front, s)), Nanos::MAX);
        // By index: `qos_ready` notes when a device waiting for budget may
        // go, as the front's own check would.
        for i in 0..self.tenants[t].active.len() {
            let d = self.tenants[t].active[i];
            let Some(slot) = self.head(d, t) else {
                continue;
            };
            let q = &self.devices[d].queue;
            let arrived = q.arrived(slot);
            if arrived >= best.1
                || self.hold_ratio(d) >= FAST_HOLD_RATIO
                || !self.device_window_open(d, &q.io(slot))
                || !self.qos_ready(d, now)
                || !(self.light(t) || self.gate_ready(d, now))
            {
                continue;
            }
            best = (Some((d, slot)), arrived);
        }
        best.0
    }

    /// Tenant `t`'s oldest IO at device `d` whose flow may take it now.
    pub(super) fn head(&self, d: usize, t: usize) -> Option<Slot> {
        self.devices[d].queue.head(t, |io| self.flow_open(io))
    }

    /// The IO's flow has room in its window (in `auto`; a light tenant's IO
    /// goes past full windows, see `light`).
    pub(super) fn flow_open(&self, io: &PacedIo) -> bool {
        self.cfg.mode != Mode::Auto
            || self.light(io.tenant)
            || self.flows.open(
                io.flow,
                u64::from(io.bytes),
                |window| self.deepen_at(io.device, window),
                |host, own| {
                    self.link
                        .as_ref()
                        .map_or(own, |(link, r)| link.host_share(*r, host, own))
                },
            )
    }

    /// `auto`'s deficit round robin: a new turn for device `front` adds one
    /// quantum. False: the device, still in debt from an expensive IO, gives
    /// the turn to the tenant's next device. Unless its oldest IO has waited
    /// too long: the debt is a share, not a stall.
    pub(super) fn drr_turn(&mut self, t: usize, front: usize, now: Nanos) -> bool {
        let quantum = self.max_io as i64;
        let dev = &mut self.devices[front];
        if dev.deficit > 0 {
            return true;
        }
        if dev.queue.oldest().is_some_and(|t0| {
            debug_assert!(now >= t0, "IO queued in the future");
            now - t0 > MAX_PACER_WAIT_NS
        }) {
            dev.deficit = dev.deficit.max(0);
        }
        dev.deficit += quantum;
        if self.devices[front].deficit <= 0 && self.tenant_has_other_device(t, front) {
            return false;
        }
        let dev = &mut self.devices[front];
        while dev.deficit <= 0 {
            dev.deficit += quantum;
        }
        true
    }

    pub(super) fn tenant_has_other_device(&self, t: usize, d: usize) -> bool {
        self.tenants[t].active.iter().any(|&x| x != d)
    }

    /// Device `d` cannot take tenant `t`'s IO now: its turn goes to the
    /// tenant's next device if another has IO and `others_blocked` says one
    /// of them may go; otherwise `otherwise`.
    pub(super) fn next_device_or(
        &mut self,
        t: usize,
        d: usize,
        otherwise: Verdict,
        others_blocked: impl FnOnce(&mut Self) -> bool,
    ) -> Verdict {
        if self.tenant_has_other_device(t, d) && !others_blocked(self) {
            Verdict::NextDevice
        } else {
            otherwise
        }
    }

    /// No device of tenant `t` can take its next IO now: its windows (in
    /// `auto`) are full or it waits for budget.
    pub(super) fn all_windows_closed(&mut self, t: usize, now: Nanos) -> bool {
        // By index: `qos_ready` notes wakeups, and this runs on every poll
        // that finds a window full, so no copy of the list is made.
        for i in 0..self.tenants[t].active.len() {
            let d = self.tenants[t].active[i];
            let Some(slot) = self.head(d, t) else {
                continue;
            };
            let io = self.devices[d].queue.io(slot);
            let bytes = u64::from(io.bytes);
            let windows = self.cfg.mode != Mode::Auto
                || (self.shared_window_open(t, self.link_share(d, bytes), bytes)
                    && self.device_window_open(d, &io));
            if windows && self.qos_ready(d, now) && (self.light(t) || self.gate_ready(d, now)) {
                return false;
            }
        }
        true
    }

    pub(super) fn all_ops_exhausted(&self, t: usize) -> bool {
        let Some(ops) = &self.device_ops else {
            return false;
        };
        self.tenants[t].active.iter().all(|&d| ops.exhausted(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_device_time_by_the_cost_model() {
        // 50k IOPS and 6 GB/s: 20 us an IO, plus its bytes.
        let cost = CostModel {
            rbps: 6e9,
            rseqiops: 5e4,
            rrandiops: 5e4,
            wbps: 3e9,
            wseqiops: 5e4,
            wrandiops: 5e4,
        };
        let d = Device::new(cost, 256 << 10);
        let small = d.work(IoKind::Read, 4096);
        let large = d.work(IoKind::Read, 256 << 10);
        assert_eq!(small, 20_683);
        assert_eq!(large, 63_691);
        // By bytes a 4 KiB read is 1/64 of a 256 KiB one; by device time,
        // nearly a third.
        assert!(4 * small > large, "{small} against {large}");
        assert_eq!(d.largest_work(256 << 10), d.work(IoKind::Write, 256 << 10));
    }

    #[test]
    fn a_device_queues_when_its_ios_wait_past_their_fixed_latency() {
        let cost = CostModel {
            rbps: 2.5e9,
            rseqiops: 2e5,
            rrandiops: 2e5,
            wbps: 2e9,
            wseqiops: 2e5,
            wrandiops: 2e5,
        };
        let mut d = Device::new(cost, 128 << 10);
        let work = d.work(IoKind::Read, 128 << 10);
        let largest = d.largest_work(128 << 10);
        assert!(!d.queues_at_device(largest), "no IO yet");
        // Alone at the device: its service plus a fixed 10 us.
        for i in 0..64 {
            d.note_wait(work + 10_000, work, i * 100_000);
        }
        assert!(!d.queues_at_device(largest));
        // Eight at a time from several reactors: each waits for the seven
        // ahead of it as well.
        for i in 64..128 {
            d.note_wait(8 * work + 10_000, work, i * 100_000);
        }
        assert!(d.queues_at_device(largest));
        // A cost model that overrates the device: no wait, never a queue.
        let mut fast = Device::new(cost, 128 << 10);
        for i in 0..64 {
            fast.note_wait(work / 2, work, i * 100_000);
        }
        assert!(!fast.queues_at_device(largest));
    }
}
