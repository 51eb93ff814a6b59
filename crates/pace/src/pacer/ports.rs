//! The target's network ports and how full they are. A flow whose window
//! is full waits for its link: either one it shares with other hosts (a
//! port at capacity), or its own (a host behind a slower link, with room
//! left on the port). The windows alone cannot tell the two apart: both
//! look like a flow that drains at some rate. Only a port's capacity can,
//! so where the target knows it (the simulator's ports, a NIC's link
//! speed), a tenant whose flows all wait on ports with room waits for its
//! own links, and holds no other tenant back (see `Pacer::link_wait` in `admit.rs`).
//! Where a flow's port or its capacity is unknown, its link is taken to be
//! shared, as the pacer did before it knew ports. A full port whose flows
//! all belong to one tenant is that tenant's own link too: it shares it
//! with no one, so waiting for it must not hold other tenants back (fuzz
//! 1:36: a weight-8 tenant alone behind a 9.2 Gb/s port held two tenants
//! on a 370 Gb/s port to a third of their share).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::filter::RATE_SAMPLE_IOS;
use super::link_window::TENANT_SLOTS;
use super::IoKind;
use crate::Nanos;

/// A port carrying at least this share of its capacity, either way, is
/// full: its flows' windows wait for a link they share. Below it, a host
/// link or a client holds them. Room for the gaps of a saturated port's
/// TCP-like flows and for the rate's measuring noise, well above what a
/// port fed by a few slow hosts carries.
const FULL_SHARE: f64 = 0.9;

/// A full port has room again only once it carries less than this share:
/// a saturated port's samples scatter around its rate (TCP's bursts, the
/// replies counted as their sends complete), and each dip under
/// `FULL_SHARE` read as room dissolved its pool (see `pools.rs`) and lifted
/// its waiting tenants' virtual times, so on a real 1 Gbit/s port tenants
/// 2:1 split it 1:1.
const ROOM_SHARE: f64 = 0.8;

/// A port's load is measured over spans at least this long: long enough
/// to hold many large IOs on a 10 GbE port, short enough to follow a
/// tenant going idle. On a slower port a span also lasts as long as
/// `RATE_SAMPLE_IOS` of the largest IO take at its capacity: on 1 Gbit/s
/// 4 ms held three or four 128 KiB replies, and whether it was full came
/// down to where their sends completed.
const PORT_SAMPLE_NS: Nanos = 4_000_000;

/// The bytes every reactor has delivered through each port, each way,
/// and the ports' capacities; shared by a target's pacers.
#[derive(Debug)]
pub struct PortLoad {
    /// Bytes a second, per port (f64 bits): a port may change speed.
    capacity: Vec<AtomicU64>,
    /// Read data sent to hosts, and write data received from them.
    sent: Vec<AtomicU64>,
    received: Vec<AtomicU64>,
    /// Per port, the flows of each tenant slot (tenant `t % TENANT_SLOTS`)
    /// that came in on it, over every reactor.
    flows: Vec<[AtomicU32; TENANT_SLOTS]>,
}

impl PortLoad {
    /// Ports of these capacities, in Gb/s.
    pub fn new(gbps: &[f64]) -> Arc<PortLoad> {
        let counters = || gbps.iter().map(|_| AtomicU64::new(0)).collect();
        Arc::new(PortLoad {
            capacity: gbps
                .iter()
                .map(|&g| AtomicU64::new(bytes_per_s(g)))
                .collect(),
            sent: counters(),
            received: counters(),
            flows: gbps.iter().map(|_| Default::default()).collect(),
        })
    }

    /// Port `port` now runs at `gbps` (ignored if there is no such port).
    pub fn set_capacity(&self, port: usize, gbps: f64) {
        if let Some(c) = self.capacity.get(port) {
            c.store(bytes_per_s(gbps), Ordering::Relaxed);
        }
    }

    /// The ports measured.
    pub fn count(&self) -> usize {
        self.capacity.len()
    }

    /// Port `port`'s capacity, Gb/s, and the bytes its flows have carried
    /// so far: read data sent and write data received (for reports).
    pub fn carried(&self, port: usize) -> (f64, u64, u64) {
        let (sent, received) = self.totals(port);
        (self.capacity(port) * 8.0 / 1e9, sent, received)
    }

    fn capacity(&self, port: usize) -> f64 {
        f64::from_bits(self.capacity[port].load(Ordering::Relaxed))
    }

    /// The one tenant slot with flows on `port`, if only one has any.
    fn sole_tenant(&self, port: usize) -> Option<usize> {
        let mut with_flows = self.flows[port]
            .iter()
            .enumerate()
            .filter(|(_, n)| n.load(Ordering::Relaxed) > 0);
        let first = with_flows.next().map(|(slot, _)| slot);
        first.filter(|_| with_flows.next().is_none())
    }

    fn totals(&self, port: usize) -> (u64, u64) {
        (
            self.sent[port].load(Ordering::Relaxed),
            self.received[port].load(Ordering::Relaxed),
        )
    }
}

fn bytes_per_s(gbps: f64) -> u64 {
    (gbps * 1e9 / 8.0).to_bits()
}

/// A flow's port, and its tenant's slot once its first IO tells it.
#[derive(Debug, Clone, Copy)]
struct PortFlow {
    port: usize,
    slot: Option<usize>,
}

/// One pacer's view of the ports: which port each of its flows came in on,
/// and which ports were full at the last sample.
#[derive(Debug)]
pub(super) struct PortMeter {
    load: Arc<PortLoad>,
    port_of: FxHashMap<u64, PortFlow>,
    /// When each port was last sampled, and its totals then.
    sampled_at: Vec<Nanos>,
    last: Vec<(u64, u64)>,
    full: Vec<bool>,
    /// The one tenant slot with flows on each port, at the last sample.
    sole: Vec<Option<usize>>,
    /// Each port has been sampled once (before, its `full` is a guess).
    measured: Vec<bool>,
    /// Counts changes to which flows are on a full port, so a window summed
    /// from them knows when to sum again (see `Windows::resize`).
    generation: u64,
}

impl PortMeter {
    pub fn new(load: Arc<PortLoad>, now: Nanos) -> PortMeter {
        let ports = load.capacity.len();
        let last = (0..ports).map(|p| load.totals(p)).collect();
        PortMeter {
            load,
            port_of: FxHashMap::default(),
            sampled_at: vec![now; ports],
            last,
            // Until measured, every port may be shared (as without ports).
            full: vec![true; ports],
            sole: vec![None; ports],
            measured: vec![false; ports],
            generation: 0,
        }
    }

    /// Flow `flow` came in on `port` (ignored if the port is unknown).
    pub fn join(&mut self, flow: u64, port: usize) {
        if port < self.full.len() {
            let old = self.port_of.insert(flow, PortFlow { port, slot: None });
            self.forget(old);
            self.generation += 1;
        }
    }

    /// `flow` carries tenant `tenant`'s IO (its first IO tells; a
    /// connection serves one export, so one tenant).
    pub fn tenant(&mut self, flow: u64, tenant: usize) {
        let Some(f) = self.port_of.get_mut(&flow) else {
            return;
        };
        if f.slot.is_none() {
            let slot = tenant % TENANT_SLOTS;
            f.slot = Some(slot);
            self.load.flows[f.port][slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn leave(&mut self, flow: u64) {
        let old = self.port_of.remove(&flow);
        self.forget(old);
        self.generation += 1;
    }

    /// A flow that left no longer counts for its tenant on its port.
    fn forget(&self, flow: Option<PortFlow>) {
        if let Some(PortFlow {
            port,
            slot: Some(slot),
        }) = flow
        {
            let before = self.load.flows[port][slot].fetch_sub(1, Ordering::Relaxed);
            debug_assert!(before > 0, "port {port}: a flow left that never came");
        }
    }

    /// `bytes` of `flow`'s data crossed its port.
    pub fn delivered(&self, flow: u64, kind: IoKind, bytes: u64) {
        let Some(&PortFlow { port: p, .. }) = self.port_of.get(&flow) else {
            return;
        };
        let way = match kind {
            IoKind::Read => &self.load.sent[p],
            IoKind::Write => &self.load.received[p],
        };
        way.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Re-measures each port once its sample's span has passed (see
    /// `PORT_SAMPLE_NS`; `max_io` is the largest IO).
    pub fn sample(&mut self, now: Nanos, max_io: u64) {
        for p in 0..self.full.len() {
            debug_assert!(now >= self.sampled_at[p], "a port sampled in the future");
            let span = now - self.sampled_at[p];
            // Most calls come within the least span: skip the capacity's
            // load and the division (runs on every completion).
            if span < PORT_SAMPLE_NS {
                continue;
            }
            let capacity = self.load.capacity(p);
            let ios = (RATE_SAMPLE_IOS * max_io) as f64 * 1e9 / capacity.max(1.0);
            if span < PORT_SAMPLE_NS.max(ios as Nanos) {
                continue;
            }
            let (sent, received) = self.load.totals(p);
            let (s0, r0) = self.last[p];
            let most = (sent - s0).max(received - r0) as f64;
            let carried = most * 1e9 / span as f64;
            let share = if self.full[p] && self.measured[p] {
                ROOM_SHARE
            } else {
                FULL_SHARE
            };
            self.measured[p] = true;
            let full = carried >= share * capacity;
            let sole = self.load.sole_tenant(p);
            self.generation += u64::from(full != self.full[p] || sole != self.sole[p]);
            self.full[p] = full;
            self.sole[p] = sole;
            self.last[p] = (sent, received);
            self.sampled_at[p] = now;
        }
    }

    /// `flow`'s link is its own, as far as the ports tell: its port is
    /// known and has room.
    pub fn own_link(&self, flow: u64) -> bool {
        self.port_of.get(&flow).is_some_and(|f| !self.full[f.port])
    }

    /// `flow`'s link is its tenant's own: its port has room, or is full
    /// but carries only its tenant's flows. (Its hosts still share it:
    /// this is for the tenants' order, not the flows' windows; counted as
    /// every flow's own link, a full port's hosts of one tenant took 31
    /// MiB where they held 9, `mixed_sizes_slow`.)
    pub fn tenants_own_link(&self, flow: u64) -> bool {
        self.port_of.get(&flow).is_some_and(|f| {
            !self.full[f.port] || (f.slot.is_some() && f.slot == self.sole[f.port])
        })
    }

    /// The port `flow` came in on, if it is known and full: its flows share
    /// it (see [`pools`](super::pools)).
    pub fn shared_port(&self, flow: u64) -> Option<usize> {
        self.port_of
            .get(&flow)
            .filter(|f| self.full[f.port])
            .map(|f| f.port)
    }

    /// Tenants `t` and `u` both have flows on a port that was full at the
    /// last sample.
    pub fn share_full_port(&self, t: usize, u: usize) -> bool {
        let (t, u) = (t % TENANT_SLOTS, u % TENANT_SLOTS);
        let on = |p: usize, slot: usize| self.load.flows[p][slot].load(Ordering::Relaxed) > 0;
        (0..self.full.len()).any(|p| self.full[p] && on(p, t) && on(p, u))
    }

    /// Changes with any flow's `shared_port`.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small largest IO: the samples span `PORT_SAMPLE_NS`.
    const IO: u64 = 4096;

    fn load_of(m: &PortMeter) -> Arc<PortLoad> {
        m.load.clone()
    }

    #[test]
    fn a_port_is_full_once_its_reactors_carry_nine_tenths_of_it() {
        // 8 Gb/s = 1e9 bytes/s: 4 MB in a 4 ms sample fills it.
        let load = PortLoad::new(&[8.0, 8.0]);
        let (mut a, mut b) = (PortMeter::new(load.clone(), 0), PortMeter::new(load, 0));
        a.join(1, 0);
        b.join(2, 0);
        a.join(3, 1);
        a.join(9, 7); // no such port: unknown, so maybe shared
        assert!(!a.own_link(1), "unmeasured ports count as shared");
        a.delivered(1, IoKind::Read, 2_000_000);
        b.delivered(2, IoKind::Read, 1_500_000);
        a.delivered(3, IoKind::Write, 1_000_000);
        a.sample(PORT_SAMPLE_NS, IO);
        assert!(a.own_link(1) && a.own_link(3), "3.5 MB and 1 MB of 4 MB");
        a.delivered(1, IoKind::Read, 2_000_000);
        b.delivered(2, IoKind::Read, 1_600_000);
        b.delivered(2, IoKind::Write, 100_000);
        a.sample(2 * PORT_SAMPLE_NS - 1, IO);
        assert!(a.own_link(1), "a sample spans at least PORT_SAMPLE_NS");
        a.delivered(1, IoKind::Read, 1);
        a.sample(2 * PORT_SAMPLE_NS, IO);
        assert!(
            !a.own_link(1),
            "both reactors' 3.6 MB and a byte: the busier way counts"
        );
        assert!(a.own_link(3));
        assert!(!a.own_link(9));
        a.leave(3);
        assert!(!a.own_link(3));
        // Port 0 slows to 4 Gb/s: 2 MB a sample.
        load_of(&a).set_capacity(0, 4.0);
        a.delivered(1, IoKind::Read, 1_000_000);
        a.sample(3 * PORT_SAMPLE_NS, IO);
        assert!(a.own_link(1), "1 MB of 2 MB");
        a.delivered(1, IoKind::Read, 1_900_000);
        a.sample(4 * PORT_SAMPLE_NS, IO);
        assert!(!a.own_link(1), "1.9 MB of 2 MB");
        a.delivered(1, IoKind::Read, 1_700_000);
        a.sample(5 * PORT_SAMPLE_NS, IO);
        assert!(!a.own_link(1), "a full port stays full at 1.7 MB of 2 MB");
        a.delivered(1, IoKind::Read, 1_500_000);
        a.sample(6 * PORT_SAMPLE_NS, IO);
        assert!(a.own_link(1), "1.5 MB of 2 MB is room");
    }

    #[test]
    fn a_full_port_with_one_tenants_flows_is_that_tenants_own_link() {
        // 8 Gb/s = 1e9 bytes/s: 4 MB in a 4 ms sample fills it.
        let load = PortLoad::new(&[8.0]);
        let (mut a, mut b) = (PortMeter::new(load.clone(), 0), PortMeter::new(load, 0));
        a.join(1, 0);
        b.join(2, 0);
        a.tenant(1, 3);
        b.tenant(2, 3);
        a.delivered(1, IoKind::Read, 4_000_000);
        a.sample(PORT_SAMPLE_NS, IO);
        assert!(
            a.tenants_own_link(1),
            "full, but only tenant 3's flows are on it"
        );
        assert!(!a.own_link(1), "its hosts share it");
        assert_eq!(a.shared_port(1), Some(0));
        // A flow whose tenant is not known yet may be anyone's.
        b.join(5, 0);
        a.delivered(1, IoKind::Read, 4_000_000);
        a.sample(2 * PORT_SAMPLE_NS, IO);
        assert!(
            a.tenants_own_link(1),
            "a flow without IO yet counts for no tenant"
        );
        b.tenant(5, 4);
        a.delivered(1, IoKind::Read, 4_000_000);
        a.sample(3 * PORT_SAMPLE_NS, IO);
        assert!(
            !a.tenants_own_link(1),
            "tenant 4 came onto the port on the other reactor"
        );
        b.leave(5);
        a.delivered(1, IoKind::Read, 4_000_000);
        a.sample(4 * PORT_SAMPLE_NS, IO);
        assert!(a.tenants_own_link(1), "tenant 4's flow left");
        b.leave(2);
        a.leave(1);
        assert_eq!(load_of(&a).sole_tenant(0), None, "no flows: no tenant");
    }

    #[test]
    fn a_slow_port_is_sampled_over_enough_of_the_largest_io() {
        // 1 Gb/s, 128 KiB IOs: 16 of them take 16.8 ms at its rate.
        let load = PortLoad::new(&[1.0]);
        let mut m = PortMeter::new(load, 0);
        m.join(1, 0);
        m.delivered(1, IoKind::Read, 300_000);
        m.sample(PORT_SAMPLE_NS, 128 << 10);
        assert!(!m.own_link(1), "not sampled yet: maybe shared");
        m.delivered(1, IoKind::Read, 1_000_000);
        m.sample(17_000_000, 128 << 10);
        assert!(m.own_link(1), "1.3 MB in 17 ms is 61%");
    }

    #[test]
    fn a_port_reports_its_capacity_and_the_bytes_it_carried() {
        let load = PortLoad::new(&[25.0]);
        let mut m = PortMeter::new(load.clone(), 0);
        m.join(1, 0);
        m.delivered(1, IoKind::Read, 4096);
        m.delivered(1, IoKind::Write, 512);
        assert_eq!(load.count(), 1);
        assert_eq!(load.carried(0), (25.0, 4096, 512));
    }
}
