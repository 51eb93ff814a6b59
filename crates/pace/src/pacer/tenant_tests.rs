//! Tenants through the pacer: weights, idle time, a light tenant's IO, a
//! configured cap at a device, and what each reactor publishes for the
//! others through the shared tenant clock.

use super::tests::{io, K128};
use super::*;

fn two_tenants(mode: Mode) -> PacingConfig {
    PacingConfig {
        mode,
        tenants: vec![
            TenantConfig::new("light", 1.0),
            TenantConfig::new("heavy", 1.0),
        ],
        ..Default::default()
    }
}

#[test]
fn a_light_tenants_one_io_passes_full_windows_but_a_backlog_does_not() {
    let mut p = Pacer::new(two_tenants(Mode::Auto), 1, K128, None, 0);
    for i in 0..100 {
        p.enqueue(io(1000 + i, 0, 1, K128), 0);
    }
    let mut out = Vec::new();
    p.poll(0, &mut out);
    let heavy = out.len();
    assert!(heavy < 100, "the window holds the heavy tenant back");
    out.clear();
    // One IO of the light tenant goes at once, past the full window.
    p.enqueue(io(1, 0, 0, K128), 0);
    p.poll(0, &mut out);
    assert_eq!(out, vec![1]);
    out.clear();
    // Its second IO, while the first is in flight, waits like any other.
    p.enqueue(io(2, 0, 0, K128), 0);
    p.poll(0, &mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn weights_split_bandwidth() {
    let c = PacingConfig {
        mode: Mode::Rate,
        period_us: Some(10.0),
        tenants: vec![
            TenantConfig::new("gold", 2.0),
            TenantConfig::new("bronze", 1.0),
        ],
        ..Default::default()
    };
    let mut p = Pacer::new(c, 1, 4096, None, 0);
    let mut id = 0;
    let mut got = [0u64; 2];
    let mut out = Vec::new();
    for step in 0..30_000u64 {
        // Both tenants always have work queued.
        while p.sched.tenants[0].queued < 8 {
            p.enqueue(io(id, 0, 0, 4096), 0);
            id += 1;
        }
        while p.sched.tenants[1].queued < 8 {
            p.enqueue(io(id | 1 << 40, 0, 1, 4096), 0);
            id += 1;
        }
        p.poll(step * 10_000, &mut out);
        for r in out.drain(..) {
            got[usize::from(r & (1 << 40) != 0)] += 1;
            p.on_complete(r, step * 10_000);
        }
    }
    let ratio = got[0] as f64 / got[1] as f64;
    assert!((ratio - 2.0).abs() < 0.1, "ratio {ratio} from {got:?}");
    let s = p.stats(300_000_000);
    assert!((s.tenants[0].share - 2.0 / 3.0).abs() < 0.05);
}

#[test]
fn idle_tenant_gets_no_hoarded_credit() {
    let c = PacingConfig {
        mode: Mode::Rate,
        period_us: Some(10.0),
        tenants: vec![TenantConfig::new("a", 1.0), TenantConfig::new("b", 1.0)],
        ..Default::default()
    };
    let mut p = Pacer::new(c, 1, 4096, None, 0);
    let mut out = Vec::new();
    // Tenant a alone for a while: it gets everything (work-conserving).
    for i in 0..1000 {
        p.enqueue(io(i, 0, 0, 4096), 0);
    }
    for s in 0..500u64 {
        p.poll(s * 10_000, &mut out);
    }
    assert!(out.len() >= 499, "{}", out.len());
    // Tenant b arrives: it shares from now on instead of catching up.
    for i in 0..1000 {
        p.enqueue(io(10_000 + i, 0, 1, 4096), 0);
    }
    out.clear();
    for s in 500..600u64 {
        p.poll(s * 10_000, &mut out);
    }
    let b = out.iter().filter(|&&i| i >= 10_000).count();
    assert!((40..=60).contains(&b), "b got {b} of {}", out.len());
}

#[test]
fn a_configured_cap_holds_heavy_ios_and_sets_no_timer_while_ours_are_there() {
    const K4: u32 = 4096;
    let mut p = Pacer::new(two_tenants(Mode::Auto), 1, K128, None, 0);
    let gate = DeviceGate::new(&[2], 2);
    p.share_gate(gate.clone());
    // Each tenant its own flow (connection).
    let of = |id: u64, tenant: usize| PacedIo {
        flow: 1 + tenant as u64,
        ..io(id, 0, tenant, K4)
    };
    let mut out = Vec::new();
    let mut now = 1_000;
    let done = |p: &mut Pacer, id: u64, now: Nanos| {
        p.on_device_complete(id, IoKind::Read, 50_000, now);
        p.on_complete(id, now);
    };
    // Two light IOs in a row mark the light tenant (see DeviceGate::released).
    for id in [1, 2] {
        p.enqueue(of(id, 0), now);
        p.poll(now, &mut out);
        now += 50_000;
        done(&mut p, id, now);
    }
    assert_eq!(out, [1, 2]);
    out.clear();
    for id in 100..110 {
        p.enqueue(of(id, 1), now);
    }
    p.poll(now, &mut out);
    assert_eq!(out, [100, 101], "held to the cap of 2");
    // Its own IOs at the device wake it: no recheck timer.
    // (auto's latency probe may set a wake of its own)
    assert_eq!(p.gates.wake, None);
    now += 50_000;
    done(&mut p, 100, now);
    done(&mut p, 101, now);
    out.clear();
    p.poll(now, &mut out);
    assert_eq!(out, [102, 103], "a batch of 2 left: refilled");
    // Slots another reactor holds free with no completion here: a timer.
    done(&mut p, 102, now);
    done(&mut p, 103, now);
    gate.arrive(0, now);
    gate.arrive(0, now);
    out.clear();
    p.poll(now, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert!(p.gates.wake.is_some_and(|t| t <= now + 100_000));
}

#[test]
fn a_tenants_io_held_by_its_own_flow_claims_no_slots_on_other_reactors() {
    // Tenant 1's host on reactor 0 queues 30 IOs at once; its flow's
    // window (4 IOs to start) holds 26 of them. Its host on reactor 1
    // queues 5 ms later. Reactor 0's old IOs wait for their own flow, not
    // the shared window, so reactor 1 need not yield its slots to them.
    let group = PacerGroup::new(
        &two_tenants(Mode::Auto),
        &[PacedDevice::default()],
        2,
        K128,
        0,
    );
    let (mut a, mut b) = (group.pacer(0, 0), group.pacer(1, 0));
    for i in 0..30 {
        a.enqueue(io(i, 0, 1, K128), 0);
    }
    let mut out = Vec::new();
    a.poll(0, &mut out);
    assert_eq!(out.len(), 4, "the flow's starting window");
    let later = 5_000_000;
    b.enqueue(
        PacedIo {
            flow: 1,
            ..io(100, 0, 1, K128)
        },
        later,
    );
    out.clear();
    a.poll(later, &mut out);
    assert!(out.is_empty(), "reactor 0's flow is still full");
    let clock = &a.sched.tenants.clock;
    assert!(
        clock.holds_oldest(1, 1, 1_000_000),
        "reactor 0 claims nothing"
    );
    out.clear();
    b.poll(later, &mut out);
    assert_eq!(out, vec![100]);
}
