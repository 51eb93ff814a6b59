//! Fair parts of a device for the flows its time binds.
//!
//! A flow's window is sized on the rate it delivered, and a drive serves
//! what it was sent in order: a flow that its window kept small got little
//! of the drive, delivered little, and was sized smaller still. Weights then
//! ordered only the room the others left. Two writers (a weight-2 tenant)
//! beside a 4 KiB reader on one drive got 43% of their share, the reader
//! 206% (fuzz 1:16, its writers at 1%).
//!
//! So a flow whose IOs spend most of their time at the device (not on its
//! wire: its link does not bind it) may always hold its weighted part of
//! that device's window: tenants by weight, the hosts within a tenant
//! equally, a host's flows equally. The part is in device time, as the
//! drive is shared, and becomes bytes at the flow's own bytes per device
//! nanosecond. The device window, the reactor window and the tenants' order
//! still bound the sum; the part only keeps a flow from being held under
//! its share by its own history.

use rustc_hash::FxHashMap;

use super::filter::SAMPLE_WEIGHT;
use super::DeviceNs;
use crate::Nanos;

/// IO is bound by its device when at least this part of its time (release
/// to done) was spent at the device: a flow's (here), and an epoch's of
/// the learned depth (`depth`), which counts only such epochs.
pub(super) const DEVICE_BOUND_SHARE: f64 = 0.5;

/// Where a flow's IOs spent their time, and what they cost the device.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DeviceSplit {
    /// Since the last sample: ns at the device and in all, and bytes and
    /// device time (see `Device::work`) delivered.
    at_device: f64,
    total: f64,
    bytes: u64,
    work: DeviceNs,
    /// Moving means: the part of the time at the device, and bytes per
    /// device nanosecond.
    device_share: Option<f64>,
    bytes_per_ns: Option<f64>,
}

/// One landed IO, as `DeviceSplit` learns it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Landing {
    pub bytes: u64,
    pub work: DeviceNs,
    pub at_device: Nanos,
    pub total: Nanos,
}

#[cfg(test)]
impl Landing {
    /// `bytes` landed, with no times or cost known (a test's).
    pub fn bytes(bytes: u64) -> Landing {
        Landing {
            bytes,
            work: DeviceNs::ZERO,
            at_device: 0,
            total: 0,
        }
    }
}

fn ewma(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + (new - o) * SAMPLE_WEIGHT)
}

impl DeviceSplit {
    pub fn add(&mut self, l: Landing) {
        debug_assert!(
            l.at_device <= l.total,
            "longer at the device than in flight"
        );
        self.at_device += l.at_device as f64;
        self.total += l.total as f64;
        self.bytes += l.bytes;
        self.work += l.work;
    }

    /// A rate sample was taken: the means learn what landed since.
    pub fn sample(&mut self) {
        if self.total > 0.0 {
            self.device_share = Some(ewma(self.device_share, self.at_device / self.total));
        }
        if self.work > DeviceNs::ZERO {
            let b = self.bytes as f64 / self.work.as_f64();
            self.bytes_per_ns = Some(ewma(self.bytes_per_ns, b));
        }
        *self = DeviceSplit {
            device_share: self.device_share,
            bytes_per_ns: self.bytes_per_ns,
            ..DeviceSplit::default()
        };
    }

    pub fn device_bound(&self) -> bool {
        self.device_share.is_some_and(|s| s >= DEVICE_BOUND_SHARE)
    }

    /// `work` device-ns of this flow's IO, in bytes.
    pub fn bytes(&self, work: DeviceNs) -> Option<u64> {
        self.bytes_per_ns.map(|b| (b * work.as_f64()) as u64)
    }
}

/// An active, device-bound flow, as `FairParts::divide` counts it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub flow: u64,
    pub device: usize,
    pub tenant: usize,
    pub host: u64,
}

/// Each device-bound flow's weighted part of its device (0..=1).
#[derive(Debug, Clone, Default)]
pub(super) struct FairParts {
    part: FxHashMap<u64, f64>,
    members: Vec<Member>,
    /// Scratch, kept to spare allocations: the weights of the tenants at
    /// each device, the hosts of each tenant there, each host's flows.
    weights: FxHashMap<usize, f64>,
    hosts: FxHashMap<(usize, usize), u32>,
    flows: FxHashMap<(usize, usize, u64), u32>,
}

impl FairParts {
    /// Divides each device among `members` by `weight` (a tenant's).
    pub fn divide(&mut self, members: impl Iterator<Item = Member>, weight: impl Fn(usize) -> f64) {
        self.members.clear();
        self.members.extend(members);
        self.part.clear();
        self.weights.clear();
        self.hosts.clear();
        self.flows.clear();
        for m in &self.members {
            let n = self.flows.entry((m.device, m.tenant, m.host)).or_insert(0);
            *n += 1;
            if *n > 1 {
                continue;
            }
            let h = self.hosts.entry((m.device, m.tenant)).or_insert(0);
            *h += 1;
            if *h == 1 {
                *self.weights.entry(m.device).or_insert(0.0) += weight(m.tenant);
            }
        }
        for m in &self.members {
            let all = self.weights[&m.device];
            let hosts = self.hosts[&(m.device, m.tenant)];
            let flows = self.flows[&(m.device, m.tenant, m.host)];
            let part = weight(m.tenant) / all / f64::from(hosts) / f64::from(flows);
            debug_assert!(part > 0.0 && part <= 1.0, "a part of a device: {part}");
            self.part.insert(m.flow, part);
        }
    }

    /// `flow`'s part of its device (None: it is not device-bound, or not
    /// active).
    pub fn part(&self, flow: u64) -> Option<f64> {
        self.part.get(&flow).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(flow: u64, device: usize, tenant: usize, host: u64) -> Member {
        Member {
            flow,
            device,
            tenant,
            host,
        }
    }

    /// Tenants by weight, hosts within a tenant equally, a host's flows
    /// equally; each device on its own.
    #[test]
    fn divides_each_device_by_tenant_then_host_then_flow() {
        let mut parts = FairParts::default();
        let members = [
            member(1, 0, 0, 10),
            member(2, 0, 0, 11),
            member(3, 0, 0, 11),
            member(4, 0, 1, 12),
            member(5, 1, 1, 12),
        ];
        parts.divide(members.into_iter(), |t| if t == 0 { 2.0 } else { 1.0 });
        let p = |f| parts.part(f).unwrap();
        assert!((p(1) - 1.0 / 3.0).abs() < 1e-9);
        assert!((p(2) - 1.0 / 6.0).abs() < 1e-9);
        assert!((p(3) - 1.0 / 6.0).abs() < 1e-9);
        assert!((p(4) - 1.0 / 3.0).abs() < 1e-9);
        assert!((p(5) - 1.0).abs() < 1e-9, "alone at its device");
        assert_eq!(parts.part(6), None);
    }

    /// A flow whose IOs wait on its wire more than at its device is not
    /// device-bound; bytes per device-ns follow what it sent.
    #[test]
    fn learns_where_the_time_went() {
        let mut s = DeviceSplit::default();
        assert!(!s.device_bound(), "unmeasured");
        let land = |at_device, total| Landing {
            bytes: 4096,
            work: DeviceNs(2048),
            at_device,
            total,
        };
        s.add(land(300, 1000));
        s.sample();
        assert!(!s.device_bound());
        assert_eq!(s.bytes(DeviceNs(1000)), Some(2000));
        let mut s = DeviceSplit::default();
        s.add(land(900, 1000));
        s.sample();
        assert!(s.device_bound());
    }
}
