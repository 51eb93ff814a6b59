//! Flows through one `auto` pacer: a small event loop where each flow's
//! replies leave over a link of its own, one at a time at the link's rate.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::*;

const K128: u32 = 128 << 10;
/// Time at the device, ns (many channels: the devices never bind).
const DEVICE_NS: Nanos = 20_000;
const WARMUP_NS: Nanos = 5_000_000;
const END_NS: Nanos = 25_000_000;

struct FlowSpec {
    /// Its host's link rate, bytes per ns; 0: the flow stops draining (a
    /// stalled client).
    rate: f64,
    qd: u32,
    /// Flows of one host share its link (`None`: a link of its own).
    host: Option<usize>,
}

fn flow(rate: f64, qd: u32) -> FlowSpec {
    FlowSpec {
        rate,
        qd,
        host: None,
    }
}

/// A connection of `host`, whose connections share one link.
fn on_host(host: usize, rate: f64, qd: u32) -> FlowSpec {
    FlowSpec {
        host: Some(host),
        ..flow(rate, qd)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    DeviceDone(u64),
    Sent(u64),
    Poll,
}

struct Loop {
    pacer: Pacer,
    specs: Vec<FlowSpec>,
    link_free: Vec<Nanos>,
    ios: HashMap<u64, PacedIo>,
    next_id: u64,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    seq: u64,
    /// Bytes each flow delivered after the warmup.
    delivered: Vec<u64>,
}

impl Loop {
    fn at(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn issue(&mut self, flow: usize, now: Nanos) {
        self.next_id += 1;
        let io = PacedIo {
            id: self.next_id,
            flow: flow as u64,
            device: (self.next_id % 4) as usize,
            tenant: 0,
            bytes: K128,
            request: K128,
            kind: IoKind::Read,
            offset: self.next_id * u64::from(K128),
        };
        self.ios.insert(io.id, io);
        self.pacer.enqueue(io, now);
    }

    fn poll(&mut self, now: Nanos) {
        let mut out = Vec::new();
        self.pacer.poll(now, &mut out);
        for id in out {
            self.at(now + DEVICE_NS, Ev::DeviceDone(id));
        }
        if let Some(t) = self.pacer.next_wakeup(now) {
            self.at(t.max(now + 1), Ev::Poll);
        }
    }

    fn handle(&mut self, now: Nanos, ev: Ev) {
        match ev {
            Ev::DeviceDone(id) => {
                let io = self.ios[&id];
                self.pacer.on_device_complete(id, io.kind, DEVICE_NS, now);
                let f = io.flow as usize;
                let rate = self.specs[f].rate;
                // Links: one per flow, then one per host.
                let link = self.specs[f].host.map_or(f, |h| self.specs.len() + h);
                if rate > 0.0 {
                    let start = self.link_free[link].max(now);
                    let done = start + (f64::from(io.bytes) / rate) as Nanos;
                    self.link_free[link] = done;
                    self.at(done, Ev::Sent(id));
                }
            }
            Ev::Sent(id) => {
                let io = self.ios.remove(&id).expect("sent once");
                self.pacer.on_complete(id, now);
                if now >= WARMUP_NS {
                    self.delivered[io.flow as usize] += u64::from(io.bytes);
                }
                self.issue(io.flow as usize, now);
            }
            Ev::Poll => {}
        }
        self.poll(now);
    }
}

/// Each flow's delivered rate after the warmup, bytes per ns.
fn run(specs: Vec<FlowSpec>) -> Vec<f64> {
    let n = specs.len();
    let mut l = Loop {
        pacer: Pacer::new(PacingConfig::default(), 4, K128, None, 0),
        specs,
        link_free: vec![0; n + 8],
        ios: HashMap::new(),
        next_id: 0,
        events: BinaryHeap::new(),
        seq: 0,
        delivered: vec![0; n],
    };
    for f in 0..n {
        if let Some(h) = l.specs[f].host {
            assert!(h < 8, "a host past the test's links");
            l.pacer.open_flow(f as u64, h as u64);
        }
        for _ in 0..l.specs[f].qd {
            l.issue(f, 0);
        }
    }
    l.poll(0);
    while let Some(Reverse((t, _, ev))) = l.events.pop() {
        if t > END_NS {
            break;
        }
        l.handle(t, ev);
    }
    l.delivered
        .iter()
        .map(|&b| b as f64 / (END_NS - WARMUP_NS) as f64)
        .collect()
}

#[test]
fn a_fast_flow_keeps_its_rate_beside_a_flow_four_times_slower() {
    let fast = || flow(10.0, 256);
    let solo = run(vec![fast()])[0];
    assert!(
        solo > 0.9 * 10.0,
        "alone, the fast flow fills its link: {solo}"
    );
    let both = run(vec![fast(), flow(2.5, 256)]);
    assert!(
        both[0] >= 0.95 * solo,
        "fast flow beside the slow one: {} of {solo} bytes/ns",
        both[0]
    );
    assert!(
        both[1] > 0.9 * 2.5,
        "the slow flow fills its own link: {}",
        both[1]
    );
}

#[test]
fn a_flow_that_stops_draining_stops_no_other() {
    let live = || flow(10.0, 32);
    let solo = run(vec![live()])[0];
    let beside = run(vec![flow(0.0, 64), live()]);
    assert_eq!(beside[0], 0.0);
    assert!(
        beside[1] >= 0.9 * solo,
        "beside a stalled flow: {} of {solo} bytes/ns",
        beside[1]
    );
}

#[test]
fn a_slow_host_with_many_connections_leaves_a_fast_host_its_link() {
    let on = |rate, host| on_host(host, rate, 64);
    let solo = run(vec![on(10.0, 1)])[0];
    // Host 0: eight connections behind one link four times slower.
    let mut specs: Vec<FlowSpec> = (0..8).map(|_| on(2.5, 0)).collect();
    specs.push(on(10.0, 1));
    let rates = run(specs);
    assert!(
        rates[8] >= 0.95 * solo,
        "fast host beside the slow one's 8 connections: {} of {solo}",
        rates[8]
    );
    let slow: f64 = rates[..8].iter().sum();
    assert!(slow > 0.9 * 2.5, "the slow host fills its own link: {slow}");
}

#[test]
fn a_stalled_connection_does_not_hold_its_hosts_other_connections() {
    let on = |rate, qd| on_host(0, rate, qd);
    let solo = run(vec![on(10.0, 32)])[0];
    let beside = run(vec![on(0.0, 64), on(10.0, 32)]);
    assert_eq!(beside[0], 0.0);
    assert!(
        beside[1] >= 0.9 * solo,
        "beside a stalled connection of its host: {} of {solo}",
        beside[1]
    );
}

#[test]
fn a_write_waiting_for_its_payload_holds_only_its_own_flows_window() {
    let mut p = Pacer::new(PacingConfig::default(), 1, K128, None, 0);
    p.open_flow(1, 7);
    p.open_flow(2, 7);
    let io = |id, flow, kind| PacedIo {
        id,
        flow,
        device: 0,
        tenant: 0,
        bytes: K128,
        request: K128,
        kind,
        offset: id * u64::from(K128),
    };
    // A writer whose payload never comes: its pieces go as far as its own
    // window lets them, and no further.
    for id in 1..=16 {
        p.enqueue(io(id, 1, IoKind::Write), 0);
    }
    let mut out = Vec::new();
    p.poll(0, &mut out);
    let held = out.len();
    assert!((1..16).contains(&held), "{held} pieces released");
    // A reader on the same host still gets the whole window.
    out.clear();
    for id in 101..=104 {
        p.enqueue(io(id, 2, IoKind::Read), 1);
    }
    p.poll(1, &mut out);
    assert_eq!(out, vec![101, 102, 103, 104]);
    // Once its payload arrives, a piece is in the pipeline like a read.
    p.on_device_start(1, 2);
    p.on_device_complete(1, IoKind::Write, 1_000, 3);
    p.on_complete(1, 3);
}

#[test]
fn host_floors_pooled_over_many_reactors_add_up_to_four_reactors_at_most() {
    // Each reactor's host floor is its part of at most four reactors'
    // floors: 16 reactors held 8-10 MiB for ~1 MiB links when each kept its own.
    let k128 = 128u64 << 10;
    for (reactors, total_ios) in [(1, 2), (2, 4), (4, 8), (16, 8), (64, 8)] {
        let cfg = PacingConfig {
            mode: Mode::Auto,
            ..Default::default()
        };
        let mut p = Pacer::new(cfg, 1, 128 << 10, None, 0);
        p.share_link(LinkWindow::new(reactors), 0);
        let total = p.windows.pooled_floor(2) * reactors as u64;
        assert_eq!(total, total_ios * k128, "{reactors} reactors");
    }
}

/// IOs one poll releases for a flow with 32 reads of 128 KiB queued, after
/// a first poll's IOs came back; `host`: its peer's id (None: a Unix
/// client); `busy_other`: a second reactor has IO queued.
fn released_for_one_flow(host: Option<u64>, busy_other: bool) -> usize {
    const NOW: Nanos = 10_000_000;
    let cfg = PacingConfig {
        mode: Mode::Auto,
        ..Default::default()
    };
    let mut p = Pacer::new(cfg, 1, K128, None, 0);
    let link = LinkWindow::new(2);
    if busy_other {
        link.publish(1, 4 * u64::from(K128), u64::from(K128), 0);
    }
    p.share_link(link, 0);
    if let Some(h) = host {
        p.open_flow(1, h);
    }
    for id in 1..=32 {
        let io = PacedIo {
            id,
            flow: 1,
            device: 0,
            tenant: 0,
            bytes: K128,
            request: K128,
            kind: IoKind::Read,
            offset: id * u64::from(K128),
        };
        p.enqueue(io, NOW);
    }
    let mut first = Vec::new();
    p.poll(NOW, &mut first);
    assert!(first.len() > 1, "a first burst goes out at once: {first:?}");
    for &id in &first {
        p.on_device_complete(id, IoKind::Read, DEVICE_NS, NOW + DEVICE_NS);
        p.on_complete(id, NOW + DEVICE_NS);
    }
    let mut out = Vec::new();
    p.poll(NOW + DEVICE_NS, &mut out);
    out.len()
}

#[test]
fn a_lone_network_host_gets_the_shared_floor_and_a_local_client_the_host_floor() {
    assert_eq!(
        released_for_one_flow(Some(7), false),
        8,
        "a TCP host alone keeps the whole shared floor in flight"
    );
    assert_eq!(
        released_for_one_flow(Some(7), true),
        4,
        "with another reactor busy, each reactor holds half of it"
    );
    assert_eq!(
        released_for_one_flow(None, false),
        4,
        "a Unix client keeps its flow's starting window"
    );
}
