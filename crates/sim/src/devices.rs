//! Simulated devices: NVMe-like drives (`parallel` channels, each busy for
//! the linear cost model's service time, the IO done a fixed latency after
//! its service) and delay devices (fixed latency, unlimited parallelism).

use pace::pacer::{CostModel, IoKind, QosConfig};
use pace::Nanos;

use crate::scenario::{DeviceGroup, DeviceKind};

pub struct Dev {
    pub kind: DeviceKind,
    latency: Nanos,
    /// When each channel is next free (FIFO: an IO takes the earliest).
    channels: Vec<Nanos>,
    pub cost: CostModel,
    /// The cost model the pacer is told.
    pub told_cost: CostModel,
    pub qos: Option<QosConfig>,
    /// Channel time spent serving IOs inside `measured` (ns, all channels).
    busy: Nanos,
    measured: (Nanos, Nanos),
}

impl Dev {
    /// Every device of every group, in index order.
    pub fn all(groups: &[DeviceGroup]) -> Vec<Dev> {
        let mut devs = Vec::new();
        for g in groups {
            for _ in 0..g.count {
                devs.push(Dev {
                    kind: g.kind,
                    latency: (g.latency_us * 1000.0) as Nanos,
                    channels: vec![0; g.parallel],
                    cost: g.cost.unwrap_or_default(),
                    told_cost: match g.cost_known {
                        true => g.cost.unwrap_or_default(),
                        false => CostModel::nvme(),
                    },
                    qos: g.qos,
                    busy: 0,
                    measured: (0, 0),
                });
            }
        }
        devs
    }

    /// The fixed latency added to every IO, ns.
    pub fn latency_ns(&self) -> f64 {
        self.latency as f64
    }

    /// IOs a drive serves at once (its channels).
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Counts busy time only inside `[from, to)`, the run's measured stretch.
    pub fn measure(&mut self, from: Nanos, to: Nanos) {
        self.measured = (from, to);
    }

    /// The share of its channels' time a drive spent serving IO in the
    /// measured stretch (None: a delay device, which has no channels).
    pub fn busy_share(&self) -> Option<f64> {
        let (from, to) = self.measured;
        let span = (to - from) * self.channels.len() as Nanos;
        (self.kind == DeviceKind::Nvme && span > 0).then(|| self.busy as f64 / span as f64)
    }

    /// Starts an IO at `now`; returns when it completes.
    pub fn start(&mut self, now: Nanos, kind: IoKind, bytes: u32) -> Nanos {
        match self.kind {
            DeviceKind::Delay => now + self.latency,
            DeviceKind::Nvme => {
                let service = self.cost.cost(kind, bytes, false) as Nanos;
                let Some(channel) = self.channels.iter_mut().min() else {
                    debug_assert!(false, "a drive has at least one channel");
                    return now + self.latency;
                };
                let start = (*channel).max(now);
                *channel = start + service;
                let (from, to) = self.measured;
                let served = (start + service).min(to).saturating_sub(start.max(from));
                self.busy += served;
                start + service + self.latency
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two channels, each IO 10 us of service: busy time counts only
    /// inside the measured stretch, over both channels.
    #[test]
    fn busy_share_counts_channel_time_inside_the_measured_stretch() {
        let cost = CostModel {
            rbps: 1e15,
            rseqiops: 1e5,
            rrandiops: 1e5,
            wbps: 1e15,
            wseqiops: 1e5,
            wrandiops: 1e5,
        };
        let group = DeviceGroup {
            count: 1,
            kind: DeviceKind::Nvme,
            latency_us: 5.0,
            parallel: 2,
            cost: Some(cost),
            cost_known: true,
            qos: None,
        };
        let mut dev = Dev::all(&[group]).remove(0);
        dev.measure(100_000, 200_000);
        // Ten IOs at 95 us: the channels alternate, each serves five back
        // to back until 145 us, 5 us of each before the stretch.
        for _ in 0..10 {
            dev.start(95_000, IoKind::Read, 4096);
        }
        let share = dev.busy_share().expect("a drive");
        // 2 x 45 us of 2 x 100 us.
        assert!((share - 0.45).abs() < 0.01, "{share}");
    }
}
