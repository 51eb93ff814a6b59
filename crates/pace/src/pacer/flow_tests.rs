//! Flows through one `auto` pacer: a small event loop where each flow's
//! replies leave over a link of its own, one at a time at the link's rate.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

const K128: u32 = 128 << 10;
/// Time at the device, ns (many channels: the devices never bind).
const DEVICE_NS: Nanos = 20_000;
const WARMUP_NS: Nanos = 5_000_000;
const END_NS: Nanos = 25_000_000;

struct FlowSpec {
    /// Link rate, bytes per ns; 0: the flow stops draining (a stalled client).
    rate: f64,
    qd: u32,
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
                self.pacer
                    .on_device_complete(io.device, io.kind, DEVICE_NS, now);
                let f = io.flow as usize;
                let rate = self.specs[f].rate;
                if rate > 0.0 {
                    let start = self.link_free[f].max(now);
                    let done = start + (f64::from(io.bytes) / rate) as Nanos;
                    self.link_free[f] = done;
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
        link_free: vec![0; n],
        ios: HashMap::new(),
        next_id: 0,
        events: BinaryHeap::new(),
        seq: 0,
        delivered: vec![0; n],
    };
    for f in 0..n {
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
    let fast = || FlowSpec {
        rate: 10.0,
        qd: 256,
    };
    let solo = run(vec![fast()])[0];
    assert!(
        solo > 0.9 * 10.0,
        "alone, the fast flow fills its link: {solo}"
    );
    let both = run(vec![fast(), FlowSpec { rate: 2.5, qd: 256 }]);
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
    let live = || FlowSpec { rate: 10.0, qd: 32 };
    let solo = run(vec![live()])[0];
    let beside = run(vec![FlowSpec { rate: 0.0, qd: 64 }, live()]);
    assert_eq!(beside[0], 0.0);
    assert!(
        beside[1] >= 0.9 * solo,
        "beside a stalled flow: {} of {solo} bytes/ns",
        beside[1]
    );
}
