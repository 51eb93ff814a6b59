//! Flows' windows and lone clients.

use super::*;

/// A flow's window after 20 ms of 128 KiB IOs delivered every 10 us
/// (13 GB/s), each from a device holding it `hold` (None: as long as
/// the reactor's min latency, 50 us).
fn window_after(hold: Option<Nanos>) -> u64 {
    let max_io = 128 << 10;
    let sizing = Sizing {
        gain: 2.0,
        max_io,
        max_window: 1 << 30,
        latency: Some(50_000),
        hold,
        queued: None,
    };
    let mut flows = Flows::default();
    for i in 0..2_000 {
        let now = i * 10_000;
        flows.queued(1, (0, 0), max_io, max_io, now);
        flows.released(1, max_io);
        flows.delivered(1, Landing::bytes(max_io), now, sizing);
        flows.landed(1, max_io);
    }
    flows.map[&1].window
}

#[test]
fn a_flow_is_lone_after_a_run_of_ios_that_find_it_empty() {
    let mut flows = Flows::default();
    let io = 4096;
    // One IO at a time: lone from the LONE_RUN-th on.
    let lone: Vec<bool> = (0..6)
        .map(|_| {
            let lone = flows.queued(1, (0, 0), io, io, 0);
            flows.released(1, io);
            flows.landed(1, io);
            lone
        })
        .collect();
    let run = LONE_RUN as usize;
    assert!(lone[..run - 1].iter().all(|l| !l) && lone[run - 1..].iter().all(|&l| l));
    // Eight at a time, emptying between bunches: never lone.
    for _ in 0..10 {
        for _ in 0..8 {
            assert!(!flows.queued(2, (0, 0), io, io, 0));
        }
        for _ in 0..8 {
            flows.released(2, io);
            flows.landed(2, io);
        }
    }
}

#[test]
fn a_host_is_on_a_device_while_one_of_its_flows_has_io_there() {
    let mut flows = Flows::default();
    let io = 4096;
    // Host 7 has a connection to device 0 and one to device 1.
    flows.join(1, 7);
    flows.join(2, 7);
    flows.queued(1, (0, 0), io, io, 0);
    let on = |flows: &Flows, d: usize| flows.host_also_on(1, |e| e == d);
    assert!(!on(&flows, 1), "flow 2 has no IO yet");
    flows.queued(2, (1, 0), io, io, 0);
    assert!(on(&flows, 1));
    assert!(!on(&flows, 0), "only flow 1 itself is on device 0");
    flows.released(2, io);
    assert!(on(&flows, 1), "in flight counts");
    flows.landed(2, io);
    assert!(!on(&flows, 1));
}

#[test]
fn a_flow_of_small_ios_is_measured_beside_large_ones() {
    // 16 KiB IOs every 100 us (164 MB/s) on a reactor whose largest IO
    // is 1 MiB: sampled by 16 of that, its first rate came after 100 ms.
    let max_io = 1 << 20;
    let sizing = Sizing {
        gain: 2.0,
        max_io,
        max_window: 1 << 30,
        latency: Some(50_000),
        hold: None,
        queued: None,
    };
    let mut flows = Flows::default();
    for i in 0..200 {
        let now = i * 100_000;
        flows.queued(1, (0, 0), 16 << 10, max_io, now);
        flows.released(1, 16 << 10);
        flows.delivered(1, Landing::bytes(16 << 10), now, sizing);
        flows.landed(1, 16 << 10);
    }
    let rate = flows.map[&1].rate.get().expect("measured within 20 ms");
    assert!((1.5e8..1.8e8).contains(&rate), "{rate}");
}

#[test]
fn a_flow_on_slow_devices_gets_the_window_its_hold_time_needs() {
    let fast = window_after(None);
    let slow = window_after(Some(500_000));
    // gain x 13.1 GB/s x 50 us = 1.3 MB; x 500 us, ten times that.
    assert!((1_000_000..2_000_000).contains(&fast), "{fast}");
    let ratio = slow as f64 / fast as f64;
    assert!((9.0..11.0).contains(&ratio), "{slow} against {fast}");
}
