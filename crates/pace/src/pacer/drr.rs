//! The scheduler: each release opportunity goes to a tenant by weighted
//! fair queuing (see [`tenants`](super::tenants)), and devices within a
//! tenant share its turns by deficit round robin, each IO charged by its
//! bytes times how long its device holds buffers; in `auto`, fast devices
//! serve their turns oldest IO first (see `Pacer::turn_server`). A device
//! that cannot go passes its turn on.

use std::cell::Cell;

use super::ablate::{self, Mechanism};
use super::drain_probe::DrainProbe;
use super::filter::{rate_filter, LargeIoMin, WindowedMax, WindowedMin, LATENCY_WINDOW_NS};
use super::queues::{DeviceQueue, Slot};
use super::tenant_clock::DeviceMask;
use super::tenant_part::TenantLoads;
use super::tenants::Tenants;
use super::{CostModel, DeviceNs, IoKind, PacedIo, TenantConfig};
use crate::Nanos;

#[derive(Debug, Default, Clone)]
pub(super) struct Device {
    pub queue: DeviceQueue,
    pub deficit: i64,
    /// Device time (ns, by its cost model) of the IOs at it: what its
    /// window bounds.
    pub in_flight_work: DeviceNs,
    pub in_flight_ios: u32,
    /// `in_flight_work` by tenant, and their demands (see `tenant_part`).
    pub tenants: TenantLoads,
    pub delivered: u64,
    /// Device time of the IOs it delivered, and its rate (ns a second).
    pub delivered_work: DeviceNs,
    pub rate: WindowedMax,
    pub latency: LargeIoMin,
    /// Min time at the device alone (submit to device completion).
    pub device_latency: WindowedMin,
    /// Private: `units` is derived from it (a new model is a new `Device`).
    cost: CostModel,
    /// `cost`'s units (see `CostModel::units`) of a random read and a
    /// random write: `work` runs several times per IO, and each `cost`
    /// divided twice.
    units: [(f64, f64); 2],
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
    /// The largest request whose IOs (pieces of it, or all of it) it was
    /// sent.
    pub largest_request: u64,
    /// The last two `largest_work` answers, (bytes, work): asked several
    /// times per IO, nearly always of the reactor's largest IO or this
    /// device's.
    largest_memo: Cell<[Option<(u64, DeviceNs)>; 2]>,
    /// Its window and hold ratio (as bits), kept within a poll (see
    /// `PollMemo`).
    pub window_memo: Cell<(u64, DeviceNs)>,
    pub ratio_memo: Cell<(u64, u64)>,
}

impl Device {
    /// A device with no IO yet, whose IOs cost what `cost` says; its rate
    /// samples span at least as much device time as `RATE_SAMPLE_IOS` of
    /// the largest IO.
    pub fn new(cost: CostModel, max_io: u64) -> Device {
        let mut d = Device {
            cost,
            units: [
                cost.units(IoKind::Read, false),
                cost.units(IoKind::Write, false),
            ],
            latency: LargeIoMin::new(LATENCY_WINDOW_NS),
            device_latency: WindowedMin::new(LATENCY_WINDOW_NS),
            wait_min: WindowedMin::new(LATENCY_WINDOW_NS),
            ..Device::default()
        };
        d.rate = rate_filter(d.largest_work(max_io).0);
        d
    }

    /// An IO of tenant `t` taking `work` of device time is at the device
    /// at `now`.
    pub fn arrive(&mut self, work: DeviceNs, t: usize, now: Nanos) {
        self.in_flight_work += work;
        self.in_flight_ios += 1;
        self.tenants.arrive(t, work, now);
    }

    /// An IO of tenant `t` taking `work` of device time left the device
    /// at `now` (None: not known, a cancel).
    pub fn leave(&mut self, work: DeviceNs, t: usize, now: Option<Nanos>) {
        debug_assert!(
            self.in_flight_ios > 0 && self.in_flight_work >= work,
            "a device lands more than it has in flight"
        );
        self.in_flight_work -= work;
        self.in_flight_ios -= 1;
        self.tenants.leave(t, work, now);
    }

    /// An IO of `work` device time spent `at_device` at the device.
    pub fn note_wait(&mut self, at_device: Nanos, work: DeviceNs, now: Nanos) {
        // A cost model that overrates the device gives a service longer
        // than the IO took: it waited nothing.
        let wait = at_device.saturating_sub(work.service_ns());
        self.wait_min.update(wait.max(1), now);
        let mean = self.wait_mean.get_or_insert(wait as f64);
        *mean += (wait as f64 - *mean) * WAIT_WEIGHT;
    }

    /// The device keeps a queue of its own: its IOs wait, on the moving
    /// mean, more than one IO of `largest_work` beyond twice its fixed
    /// latency. The device itself then bounds its IOs, not the links or
    /// the windows.
    pub fn queues_at_device(&self, largest_work: DeviceNs) -> bool {
        if ablate::out(Mechanism::DeviceQueue) {
            return false;
        }
        match (self.wait_mean, self.wait_min.get()) {
            (Some(mean), Some(min)) => mean > (2 * min + largest_work.service_ns()) as f64,
            _ => false,
        }
    }

    /// How long its IOs need their buffers: the min release-to-done time,
    /// but no more than its time at the device plus the fastest
    /// release-to-done (`fastest`, the send path). See `Windows::hold_time`.
    pub fn hold(&self, fastest: Option<Nanos>) -> Option<Nanos> {
        let measured = self.latency.get()?;
        match (self.device_latency.get(), fastest) {
            (Some(at_device), Some(fastest)) => Some(measured.min(at_device + fastest)),
            _ => Some(measured),
        }
    }

    /// How much longer than the fastest device it holds its buffers (see
    /// `Windows::hold_ratio`).
    pub fn hold_ratio(&self, fastest: Option<Nanos>) -> f64 {
        match (self.hold(fastest), fastest) {
            (Some(l), Some(fastest)) => (l as f64 / fastest as f64).clamp(1.0, 1000.0),
            _ => 1.0,
        }
    }

    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The device time an IO takes, by the device's cost model: its
    /// window counts this, not bytes, so small IOs (each costing the
    /// device a fixed time on top of its bytes) cannot crowd a busy
    /// device past what the window means.
    pub fn work(&self, kind: IoKind, bytes: u64) -> DeviceNs {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let (per_io, per_byte) = match kind {
            IoKind::Read => self.units[0],
            IoKind::Write => self.units[1],
        };
        // As `self.cost.cost(kind, bytes, false)`, without its divisions.
        let cost = per_io + f64::from(bytes) * per_byte;
        debug_assert_eq!(cost.to_bits(), self.cost.cost(kind, bytes, false).to_bits());
        DeviceNs(super::ceil_u64(cost).max(1))
    }

    /// The device time of the costlier of a read and a write of `bytes`.
    pub fn largest_work(&self, bytes: u64) -> DeviceNs {
        let memo = self.largest_memo.get();
        if let Some(work) = memo.iter().flatten().find(|m| m.0 == bytes).map(|m| m.1) {
            debug_assert_eq!(work, self.largest_work_of(bytes));
            return work;
        }
        let work = self.largest_work_of(bytes);
        // The newer answer stays, the older goes.
        self.largest_memo.set([Some((bytes, work)), memo[0]]);
        work
    }

    /// The least window (device time): room for two of its `largest` IO,
    /// and for the whole of the largest request it was sent, whose pieces
    /// come together. With two 128 KiB pieces' room an idle connection's
    /// 1 MiB read reached its drive two pieces at a time: one host at QD 4
    /// over 88 drives carried 69% of its link (fuzz 1:77; 100% unpaced).
    pub fn window_floor(&self, largest: DeviceNs) -> DeviceNs {
        // A request no larger than its largest IO (no pieces) fits in two
        // of them already: no third size for `largest_work`'s memo.
        if self.largest_request <= self.largest_io {
            return 2 * largest;
        }
        (2 * largest).max(self.largest_work(self.largest_request))
    }

    fn largest_work_of(&self, bytes: u64) -> DeviceNs {
        self.work(IoKind::Read, bytes)
            .max(self.work(IoKind::Write, bytes))
    }

    /// Tenant `t` may send another IO to this device (mechanism 31, see
    /// `tenant_part`): it has under its weighted part there (`weight` gives
    /// a tenant's weight) of the least demand per weight among the tenants
    /// at the device that their queue depth does not hold.
    /// A demand is a tenant's device time at the device and queued for it
    /// here. One IO may cross the part, as one may a window: a 1 MiB read
    /// larger than its tenant's part would otherwise go only alone.
    pub(super) fn tenant_part_open(&self, weight: impl Fn(usize) -> f64, t: usize) -> bool {
        let mine = self.tenants.at_device(t);
        if mine == DeviceNs::ZERO || ablate::out(Mechanism::TenantPart) {
            return true;
        }
        let Some((rate, least_latency)) = self.rate.get().zip(self.least_latency()) else {
            return true;
        };
        let queued = |u: usize| self.queue.tenant_work(u).as_f64();
        let demand = |u: usize| self.tenants.mean(u) + queued(u);
        let tenants =
            (0..self.tenants.len().max(self.queue.tenants())).filter(|&u| demand(u) > 0.0);
        let all_weight: f64 = tenants.clone().map(&weight).sum();
        // The device time a tenant keeps at the device at its share of the
        // device's rate (device ns a second), at the least latency (Little).
        let share_depth = |u: usize| weight(u) / all_weight * rate / 1e9 * least_latency as f64;
        // One IO at a time is always held by its depth: parts of half an IO
        // would idle a device whose rate grows with its queue (this machine's
        // disk), and its rate, fallen, would then hold the QD 1 tenant's next
        // IO to a part too (bronze at QD 32 fell to 33% of its rate alone).
        let one_io = self.largest_work(self.largest_io).as_f64();
        let held_by_depth = |u: usize| demand(u) <= one_io || demand(u) < share_depth(u);
        if held_by_depth(t) {
            return true;
        }
        let per_weight = tenants
            .filter(|&u| u != t && !held_by_depth(u))
            .map(|u| demand(u) / weight(u))
            .fold(f64::INFINITY, f64::min);
        mine.as_f64() < weight(t) * per_weight
    }

    /// The device's least latency: alone (see `DrainProbe`), as a device
    /// that never drains sees only queued latencies (710 us on a 16-channel
    /// drive whose IOs take 240 us alone).
    fn least_latency(&self) -> Option<Nanos> {
        let seen = self.device_latency.get();
        match (self.probe.latency_alone(0), seen) {
            (Some(alone), Some(seen)) => Some(alone.min(seen)),
            (alone, seen) => alone.or(seen),
        }
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

/// What each release opportunity goes to: a tenant by weighted fair
/// queuing ([`Tenants`]), then one of its devices by deficit round robin.
pub(super) struct Scheduler {
    pub tenants: Tenants,
    pub devices: Vec<Device>,
}

impl Scheduler {
    /// The configured tenants over `devices` device queues with default
    /// cost models; `max_io` is the largest IO expected.
    pub fn new(tenants: &[TenantConfig], devices: usize, max_io: u64) -> Scheduler {
        Scheduler {
            tenants: Tenants::new(tenants),
            devices: vec![Device::new(CostModel::default(), max_io); devices.max(1)],
        }
    }

    /// The device whose DRR turn it is for tenant `t`; devices left with
    /// no IO of `t` leave the rotation first.
    pub fn front_device(&mut self, t: usize) -> Option<usize> {
        loop {
            let front = self.tenants[t].active.front().copied()?;
            if self.devices[front].queue.has(t) {
                return Some(front);
            }
            self.tenants[t].active.pop_front();
        }
    }

    /// `auto`'s deficit round robin: a new turn for device `front` adds one
    /// `quantum`. False: the device, still in debt from an expensive IO,
    /// gives the turn to the tenant's next device. Unless its oldest IO has
    /// waited too long: the debt is a share, not a stall.
    pub fn drr_turn(&mut self, t: usize, front: usize, quantum: i64, now: Nanos) -> bool {
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

    /// Takes tenant `t`'s IO `io` at `slot` of device `d`, serving device
    /// `front`'s turn, out of its queue.
    pub fn take(&mut self, t: usize, d: usize, front: usize, slot: Slot, io: &PacedIo) {
        let dev = &mut self.devices[d];
        dev.queue.take(slot);
        dev.last_offset = io.offset + u64::from(io.bytes);
        if d != front && !dev.queue.has(t) {
            self.tenants[t].active.retain(|&x| x != d);
        }
    }

    /// Charges tenant `t`'s release of `bytes`: `cost` to its virtual
    /// time, `charge` to device `front`'s turn. A spent turn passes to the
    /// tenant's next device, getting `refill` back if given.
    pub fn charge(
        &mut self,
        t: usize,
        front: usize,
        bytes: u64,
        charge: i64,
        cost: f64,
        refill: Option<i64>,
    ) {
        let weight = self.tenants[t].weight;
        self.tenants.clock.advance(t, cost / weight);
        self.tenants.clock.dequeued(t);
        self.tenants[t].usage_bytes += bytes;
        self.tenants.unqueue(t, bytes);
        let dev = &mut self.devices[front];
        dev.deficit -= charge;
        if dev.deficit <= 0 || !dev.queue.has(t) {
            if let Some(quantum) = refill {
                dev.deficit += quantum;
            }
            let still = dev.queue.has(t);
            let tenant = &mut self.tenants[t];
            tenant.active.pop_front();
            if still {
                tenant.active.push_back(front);
            }
        }
    }

    pub fn tenant_has_other_device(&self, t: usize, d: usize) -> bool {
        self.tenants[t].active.iter().any(|&x| x != d)
    }

    /// Publishes at which devices each tenant has IO queued, for the
    /// reactors' shared tenant clock. Only with tenants on pooled reactors
    /// (`reactor`: this one's index among them).
    pub fn publish_queued(&self, reactor: Option<usize>) {
        let Some(r) = reactor else { return };
        let clock = &self.tenants.clock;
        if self.tenants.len() < 2 || clock.reactors() < 2 {
            return;
        }
        for (t, tenant) in self.tenants.iter().enumerate() {
            clock.set_devices(DeviceMask::Queued, t, r, tenant.queued_devices());
        }
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
        assert_eq!(small, DeviceNs(20_683));
        assert_eq!(large, DeviceNs(63_691));
        // By bytes a 4 KiB read is 1/64 of a 256 KiB one; by device time,
        // nearly a third.
        assert!(4 * small > large, "{small:?} against {large:?}");
        assert_eq!(d.largest_work(256 << 10), d.work(IoKind::Write, 256 << 10));
    }

    #[test]
    fn a_window_floor_holds_the_largest_request_whole() {
        let mut d = Device::new(CostModel::nvme(), 128 << 10);
        let piece = d.largest_work(128 << 10);
        assert_eq!(d.window_floor(piece), 2 * piece, "no request yet");
        (d.largest_io, d.largest_request) = (128 << 10, 128 << 10);
        assert_eq!(d.window_floor(piece), 2 * piece, "requests fit a buffer");
        // A 1 MiB request comes as 8 pieces: all of them may be at the
        // device, not 2.
        d.largest_request = 1 << 20;
        assert_eq!(d.window_floor(piece), d.largest_work(1 << 20));
        assert!(d.window_floor(piece) > 4 * piece);
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
            d.note_wait(work.service_ns() + 10_000, work, i * 100_000);
        }
        assert!(!d.queues_at_device(largest));
        // Eight at a time from several reactors: each waits for the seven
        // ahead of it as well.
        for i in 64..128 {
            d.note_wait(8 * work.service_ns() + 10_000, work, i * 100_000);
        }
        assert!(d.queues_at_device(largest));
        // A cost model that overrates the device: no wait, never a queue.
        let mut fast = Device::new(cost, 128 << 10);
        for i in 0..64 {
            fast.note_wait(work.service_ns() / 2, work, i * 100_000);
        }
        assert!(!fast.queues_at_device(largest));
    }
}
