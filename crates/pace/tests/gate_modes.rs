//! Found by `iopace sim --faults`: a pacer built for `auto` with tenants
//! shares a device gate that counts each tenant's IOs in flight. After a
//! `set_pacing` to a mode that bypasses the pacer (`none`, `buffers`),
//! IOs were released without the gate counting them, and landed with it
//! counting them down: "tenant 0: lands more than it released" (a debug
//! assert; in release builds a tenant's count went wrong).

use pace::pacer::{
    CostModel, IoKind, Mode, PacedDevice, PacedIo, PacerGroup, PacingConfig, TenantConfig,
};

fn config(mode: Mode) -> PacingConfig {
    PacingConfig {
        mode,
        tenants: vec![TenantConfig::new("a", 1.0), TenantConfig::new("b", 2.0)],
        ..PacingConfig::default()
    }
}

#[test]
fn ios_released_past_the_pacer_land_on_the_gate_in_balance() {
    let device = PacedDevice {
        cost: CostModel::nvme(),
        qos: None,
    };
    let group = PacerGroup::new(&config(Mode::Auto), &[device], 1, 131072, 0);
    let mut p = group.pacer(0, 0);
    p.reconfigure(config(Mode::None), 1);
    let mut out = Vec::new();
    for (id, tenant) in [(1, 0), (2, 1)] {
        let io = PacedIo {
            id,
            flow: 1,
            device: 0,
            tenant,
            bytes: 4096,
            kind: IoKind::Read,
            offset: 0,
        };
        p.enqueue(io, 2);
    }
    p.poll(3, &mut out);
    assert_eq!(out, vec![1, 2]);
    // One completes, one is cancelled (its connection died): both land.
    p.on_device_complete(1, IoKind::Read, 10_000, 10_000);
    p.on_complete(1, 20_000);
    assert!(p.cancel(2));
    p.reconfigure(config(Mode::Auto), 30_000);
    assert_eq!(p.bytes_in_flight(), 0);
}
