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
    pub qos: Option<QosConfig>,
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
                    qos: g.qos,
                });
            }
        }
        devs
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
                start + service + self.latency
            }
        }
    }
}
