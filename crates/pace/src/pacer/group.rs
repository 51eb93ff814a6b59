//! One target's pacers, one per reactor, and what they share: the
//! tenants' virtual time, the devices' latency targets and budgets, the
//! pooled link window, `auto`'s depth and `rate`'s device op limit. The server and the
//! simulator both build their pacers here, so they share the same state.

use std::sync::Arc;

use super::ablate::{self, Mechanism};
use super::TenantClock;
use super::{
    CostModel, DeviceGate, DeviceOps, DeviceQos, DeviceShares, LinkWindow, Mode, Pacer,
    PacingConfig, PortLoad, QosConfig, SharedDepth,
};
use crate::Nanos;

/// What a pacer knows of one device.
#[derive(Debug, Clone, Copy, Default)]
pub struct PacedDevice {
    pub cost: CostModel,
    /// Its latency target, if it has one.
    pub qos: Option<QosConfig>,
}

/// Builds each reactor's [`Pacer`] over the state they share.
#[derive(Debug)]
pub struct PacerGroup {
    cfg: PacingConfig,
    costs: Vec<CostModel>,
    buffer_size: u32,
    device_ops: Option<Arc<DeviceOps>>,
    tenants: Arc<TenantClock>,
    qos: Arc<DeviceQos>,
    link: Arc<LinkWindow>,
    depth: Arc<SharedDepth>,
    shares: Arc<DeviceShares>,
    /// Only tenants have light tenants to guard: in `auto`, or on a device
    /// with a configured cap (`light_depth`) in any mode.
    gate: Option<Arc<DeviceGate>>,
    /// The target's ports, where their capacities are known.
    ports: Option<Arc<PortLoad>>,
}

/// The device gate `cfg`'s tenants need over `devices`, if any.
fn gate(cfg: &PacingConfig, devices: &[PacedDevice]) -> Option<Arc<DeviceGate>> {
    let depths: Vec<u32> = devices
        .iter()
        .map(|d| d.qos.and_then(|q| q.light_depth).unwrap_or(0))
        .collect();
    let capped = depths.iter().any(|&n| n > 0);
    let wanted = cfg.tenants.len() > 1 && (cfg.mode == Mode::Auto || capped);
    (wanted && !ablate::out(Mechanism::Gate)).then(|| DeviceGate::new(&depths, cfg.tenants.len()))
}

impl PacerGroup {
    /// The shared state for `reactors` pacers over `devices`, pacing by
    /// `cfg`; `buffer_size` is the pool's (see [`Pacer::new`]).
    pub fn new(
        cfg: &PacingConfig,
        devices: &[PacedDevice],
        reactors: usize,
        buffer_size: u32,
        now: Nanos,
    ) -> PacerGroup {
        let targets: Vec<Option<QosConfig>> = devices.iter().map(|d| d.qos).collect();
        PacerGroup {
            cfg: cfg.clone(),
            costs: devices.iter().map(|d| d.cost).collect(),
            buffer_size,
            device_ops: cfg
                .device_ops
                .map(|limit| DeviceOps::new(devices.len(), limit)),
            // Tenant 0 is the default when none is configured.
            tenants: TenantClock::with_reactors(cfg.tenants.len().max(1), reactors),
            qos: DeviceQos::new(&targets, now),
            link: LinkWindow::new(reactors),
            depth: SharedDepth::new(devices.len()),
            shares: DeviceShares::new(devices.len(), reactors),
            gate: gate(cfg, devices),
            ports: None,
        }
    }

    /// The pacers built from now on measure ports of these capacities,
    /// Gb/s (see `PortLoad`); a flow's port is its index here. The
    /// simulator's ports and the real target's listeners (`[server] tcp`
    /// with `gbps`) both come in here; the load is returned for reports
    /// and for ports that change speed.
    pub fn measure_ports(&mut self, gbps: &[f64]) -> Arc<PortLoad> {
        let load = PortLoad::new(gbps);
        self.ports = Some(load.clone());
        load
    }

    /// Reactor `reactor`'s pacer.
    pub fn pacer(&self, reactor: usize, now: Nanos) -> Pacer {
        let mut p = Pacer::new(
            self.cfg.clone(),
            self.costs.len(),
            self.buffer_size,
            self.device_ops.clone(),
            now,
        );
        for (i, cost) in self.costs.iter().enumerate() {
            p.set_cost_model(i, *cost);
        }
        p.share_tenants(self.tenants.clone());
        p.share_qos(self.qos.clone());
        p.share_link(self.link.clone(), reactor);
        p.share_depth(self.depth.clone());
        // Used only where the link window is pooled (two or more reactors).
        p.share_devices(self.shares.clone());
        if let Some(g) = &self.gate {
            p.share_gate(g.clone());
        }
        if let Some(load) = &self.ports {
            p.share_ports(load.clone(), now);
        }
        p
    }

    /// The devices' latency targets and budgets (their vrates for reports).
    pub fn qos(&self) -> &Arc<DeviceQos> {
        &self.qos
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacer::{CostModel, IoKind, PacedIo, TenantConfig};

    #[test]
    fn a_groups_pacers_share_the_device_op_limit_and_the_tenant_clock() {
        let cfg = PacingConfig {
            mode: Mode::Rate,
            period_us: Some(1.0),
            device_ops: Some(1),
            ..PacingConfig::default()
        };
        let group = PacerGroup::new(&cfg, &[PacedDevice::default()], 2, 4096, 0);
        let mut pacers = [group.pacer(0, 0), group.pacer(1, 0)];
        let mut out = Vec::new();
        for (r, p) in pacers.iter_mut().enumerate() {
            let io = PacedIo {
                id: r as u64,
                flow: r as u64,
                device: 0,
                tenant: 0,
                bytes: 4096,
                request: 4096,
                kind: IoKind::Read,
                offset: 0,
            };
            p.enqueue(io, 0);
            p.poll(1_000, &mut out);
        }
        assert_eq!(out, [0], "one op slot for both reactors");
        assert_eq!(group.tenants.tenants(), 1);
        pacers[0].on_complete(0, 2_000);
        pacers[1].poll(3_000, &mut out);
        assert_eq!(out, [0, 1], "the slot freed on reactor 0 serves reactor 1");
    }

    fn tenants_config(mode: Mode) -> PacingConfig {
        PacingConfig {
            mode,
            tenants: vec![TenantConfig::new("a", 1.0), TenantConfig::new("b", 2.0)],
            ..PacingConfig::default()
        }
    }

    // Found by `iopace sim --faults`: a pacer built for `auto` with tenants
    // shares a device gate that counts each tenant's IOs in flight. After a
    // `set_pacing` to a mode that bypasses the pacer (`none`, `buffers`),
    // IOs were released without the gate counting them, and landed with it
    // counting them down: "tenant 0: lands more than it released" (a debug
    // assert; in release builds a tenant's count went wrong).
    #[test]
    fn ios_released_past_the_pacer_land_on_the_gate_in_balance() {
        let device = PacedDevice {
            cost: CostModel::nvme(),
            qos: None,
        };
        let group = PacerGroup::new(&tenants_config(Mode::Auto), &[device], 1, 131072, 0);
        let mut p = group.pacer(0, 0);
        p.reconfigure(tenants_config(Mode::None), 1);
        let mut out = Vec::new();
        for (id, tenant) in [(1, 0), (2, 1)] {
            p.enqueue(PacedIo::read_4k(id, 1, tenant), 2);
        }
        p.poll(3, &mut out);
        assert_eq!(out, vec![1, 2]);
        // One completes, one is cancelled (its connection died): both land.
        p.on_device_complete(1, IoKind::Read, 10_000, 10_000);
        p.on_complete(1, 20_000);
        assert!(p.cancel(2));
        p.reconfigure(tenants_config(Mode::Auto), 30_000);
        assert_eq!(p.bytes_in_flight(), 0);
    }
}
