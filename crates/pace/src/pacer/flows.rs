//! Flows and hosts: each connection drains at its own rate (its socket,
//! its host's link), so `auto` admits each flow's IO only as fast as that
//! flow drains, and each host's IO only as fast as its link drains.
//!
//! - A flow's window is near its bandwidth-delay product: gain x (max rate
//!   its own completions delivered) x (how long its IOs hold their buffers
//!   with no queue: the mean, by bytes, of its devices' hold times, at
//!   least the reactor's min latency), and at least `FLOW_MIN_IOS` of the
//!   largest IO. A flow whose IOs go to slow devices needs more in flight
//!   for its rate than one on the fastest: sized on the reactor's min
//!   latency, such a flow's window bounded its rate, and each sample sized
//!   the next window smaller (a host reading from 600 us drives beside a
//!   20 us one carried 14 Gb/s of the 46 its links took).
//! - A host (a peer address; its connections share its link) has a window
//!   of its flows' bandwidth-delay products, and at least `HOST_MIN_IOS` of
//!   the largest IO: a host behind a slow wire keeps its link busy with a
//!   few IOs, however many connections it opens, and a host with many
//!   connections does not add up their floors.
//! - A reactor's window is the sum of its hosts' windows, so replies queued
//!   for a slow host fill only that host's window, and a fast host's IO never
//!   waits behind them.
//! - The network hosts active on a reactor share a floor of a few of the
//!   largest IO (`Floors::shared`), split among them, and a host's part is
//!   split among its active flows. A TCP socket takes a reply's bytes only as
//!   fast as the peer acks them, so a fast wire with a short measured latency
//!   still needs several large IOs in flight to stay busy: over loopback,
//!   128 KiB reads at 2 IOs per host ran at 3.0-3.5 GiB/s, at 8 IOs
//!   4.0-4.2 GiB/s. A Unix client is not a network host and keeps
//!   `HOST_MIN_IOS`: its socket buffer holds about 2 such replies
//!   (wmem_default 208 KiB), and 8 IOs ran slower there (3.3 against
//!   4.6-5.7 GiB/s), the extra IOs waiting on a full socket.
//!
//! What counts against a host's and the reactor's window is IO in the
//! pipeline: a read from its release, a write piece once its payload has
//! arrived. A write piece waiting for its payload, and every IO of a flow
//! that has stopped draining (a stalled client, one that reads no replies),
//! hold only their own flow's window.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use super::ablate::{self, Mechanism};
use super::fair::{DeviceSplit, FairParts, Landing, Member};
use super::filter::{
    rate_filter, WindowedMax, PROBE_EVERY, PROBE_GAIN, RATE_SAMPLE_IOS, RATE_SAMPLE_NS,
    SAMPLE_WEIGHT,
};
use super::pools::Pools;
use super::sizing::{Floors, Sizing};
use super::DeviceNs;
use crate::Nanos;

/// A flow's window holds at least this many of the largest IO: one being
/// sent while the next is read from the device.
const FLOW_MIN_IOS: u64 = 2;
/// A host's window holds at least this many of the largest IO.
pub(super) const HOST_MIN_IOS: u64 = 2;
/// A new flow starts with this many IOs of window, and grows from there as
/// its completions show the rate.
const FLOW_START_IOS: u64 = 4;
/// A flow's rate sample spans at most this long, however few bytes it
/// holds (see `WindowedMax::with_max_span`).
const FLOW_SAMPLE_MAX_NS: Nanos = 10 * RATE_SAMPLE_NS;
/// A flow is a lone client (one IO at a time) once this many of its IOs
/// in a row found it with nothing else queued or in flight. A deeper
/// client empties now and then (fio at QD 8 on this machine's disk, whose
/// completions come in bunches; `qemu-img bench` too), and one such IO in
/// 100 ms held its device at depth 1 in 92-100% of polls, `auto` at ~540
/// MiB/s where `none` ran 720-1000 (`docs/evidence.md#device-time-window`).
const LONE_RUN: u32 = 4;
/// A flow with IO in the pipeline and no progress for this long has
/// stalled: its IO leaves its host's and the reactor's windows.
pub(super) const STALL_NS: Nanos = 20_000_000;

/// Whether a flow's IO in the pipeline counts against its host's and the
/// reactor's windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    Draining,
    Stalled,
}

#[derive(Debug, Clone)]
struct Flow {
    host: u64,
    /// Its tenant (a connection serves one export).
    tenant: usize,
    /// The device its export is on (a connection serves one export).
    device: usize,
    drain: Drain,
    queued: usize,
    /// Bytes released and not landed: what its own window bounds.
    in_flight: u64,
    /// Of those, bytes in the pipeline, and their link share (see
    /// `Windows::link_share`).
    piped: u64,
    piped_paced: u64,
    /// When it last delivered, or last entered the pipeline from empty.
    progress_at: Nanos,
    delivered: u64,
    rate: WindowedMax,
    /// Its largest IO yet.
    largest: u64,
    /// How many of its IOs in a row found it with nothing queued or in
    /// flight.
    lone_run: u32,
    window: u64,
    /// gain x rate x latency, without the floor (None until measured).
    bdp: Option<u64>,
    samples: u64,
    /// Bytes delivered since the last rate sample, times their devices'
    /// hold times (byte-ns), those bytes, and the mean of the last
    /// samples' hold times (ns).
    hold_sum: f64,
    hold_bytes: u64,
    hold: Option<f64>,
    /// The full port whose pool it is in (see [`pools`](super::pools)),
    /// and the most it may hold there.
    pool: Option<usize>,
    pool_cap: u64,
    /// Where its IOs spend their time (see [`fair`](super::fair)).
    split: DeviceSplit,
}

#[derive(Debug, Clone, Default)]
struct Host {
    /// Named by `join` (a peer address): its windows on every reactor are
    /// pooled. A flow never joined is a host of its own, here alone.
    pooled: bool,
    /// Bytes in the pipeline of its draining flows.
    piped: u64,
    window: u64,
    /// Bytes of its IO queued here.
    queued: u64,
    /// Its flows with IO queued or in flight, and each one's least window:
    /// its part of this host's part of the shared floor.
    flows: u64,
    flow_floor: u64,
    /// Its window as last published to the other reactors.
    published: u64,
    /// Its pooled flows' port, summed rates and products (see
    /// `pool_flows`), and the most they may hold together.
    pooled_sum: Option<(usize, f64, u64)>,
    pool_cap: u64,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Flows {
    map: FxHashMap<u64, Flow>,
    hosts: FxHashMap<u64, Host>,
    /// Each flow's host, from `open` (a flow never opened is its own host).
    host_of: FxHashMap<u64, u64>,
    /// The link share of every draining flow's bytes in the pipeline.
    paced_total: u64,
    /// Hosts forgotten since `each_host` last ran.
    gone: Vec<u64>,
    /// An active pooled host's window was last published as 0: the other
    /// reactors would pool it as 0 (see `window_sum`).
    unpublished: bool,
    /// The windows of flows that share a full port.
    pools: Pools,
    /// Device-bound flows' parts of their devices.
    fair: FairParts,
    /// Something `window_sum` reads changed since it last ran: a flow
    /// came, went, became active or idle, or took a rate sample (see
    /// `Windows::resize`, which sums again only then). What only pooled
    /// flows read (bytes in the pipe, drain) is not tracked: a sum with a
    /// flow on a full port is not kept.
    stale: bool,
}

/// A flow never opened gets a host id of its own, apart from peer ids.
fn own_host(flow: u64) -> u64 {
    flow | 1 << 63
}

impl Flows {
    /// Flow `flow` is a connection from `host` (a peer address's id).
    pub fn join(&mut self, flow: u64, host: u64) {
        debug_assert!(!self.map.contains_key(&flow), "flow {flow} opened twice");
        self.host_of.insert(flow, host & !(1 << 63));
        self.stale = true;
    }

    /// Something `window_sum` reads changed since it last ran.
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// `flow`'s books, opened on its first IO. Its host is looked up only
    /// then: a host's entry lives as long as one of its flows (see `close`).
    fn flow(&mut self, flow: u64, max_io: u64, now: Nanos) -> &mut Flow {
        let e = match self.map.entry(flow) {
            Entry::Occupied(e) => return e.into_mut(),
            Entry::Vacant(e) => e,
        };
        self.stale = true;
        let host = self.host_of.get(&flow).copied();
        if let Some(h) = host {
            self.hosts.entry(h).or_default().pooled = true;
        }
        e.insert(Flow {
            host: host.unwrap_or_else(|| own_host(flow)),
            tenant: 0,
            device: 0,
            drain: Drain::Draining,
            queued: 0,
            in_flight: 0,
            piped: 0,
            piped_paced: 0,
            progress_at: now,
            delivered: 0,
            rate: rate_filter(0).with_max_span(FLOW_SAMPLE_MAX_NS),
            largest: 0,
            lone_run: 0,
            window: FLOW_START_IOS * max_io,
            bdp: None,
            samples: 0,
            hold_sum: 0.0,
            hold_bytes: 0,
            hold: None,
            pool: None,
            pool_cap: 0,
            split: DeviceSplit::default(),
        })
    }

    /// One IO of `flow` (to `device`, of `tenant`), `bytes` long, was
    /// queued. True: the flow had
    /// nothing else queued or in flight, nor at its last `LONE_RUN - 1`
    /// IOs (a client that waits for each reply before it sends the next
    /// request).
    pub fn queued(
        &mut self,
        flow: u64,
        (device, tenant): (usize, usize),
        bytes: u64,
        max_io: u64,
        now: Nanos,
    ) -> bool {
        let f = self.flow(flow, max_io, now);
        let empty = f.queued == 0 && f.in_flight == 0;
        let moved = (f.device, f.tenant) != (device, tenant);
        (f.device, f.tenant) = (device, tenant);
        if bytes > f.largest {
            // Its rate samples span RATE_SAMPLE_IOS of its own largest IO:
            // of the reactor's (1 MiB beside it), a flow of 4-256 KiB IOs
            // on a slow link took half a second a sample and kept its
            // starting window meanwhile.
            f.largest = bytes;
            f.rate.set_min_bytes(RATE_SAMPLE_IOS * bytes);
        }
        f.lone_run = if empty {
            (f.lone_run + 1).min(LONE_RUN)
        } else {
            0
        };
        let lone = empty && f.lone_run >= LONE_RUN;
        f.queued += 1;
        let host = f.host;
        self.stale |= empty || moved;
        self.hosts.entry(host).or_default().queued += bytes;
        lone
    }

    /// A queued IO of `flow`, `bytes` long, left its queue: released or
    /// cancelled.
    fn dequeued(&mut self, flow: u64, bytes: u64) -> Option<&mut Flow> {
        let f = self.map.get_mut(&flow)?;
        debug_assert!(f.queued > 0, "flow {flow}: dequeue of an IO never queued");
        f.queued -= 1;
        let host = self.hosts.entry(f.host).or_default();
        debug_assert!(host.queued >= bytes);
        host.queued -= bytes;
        Some(f)
    }

    /// One queued IO of `flow`, `bytes` long, was cancelled.
    pub fn unqueued(&mut self, flow: u64, bytes: u64) {
        let idle = self
            .dequeued(flow, bytes)
            .is_some_and(|f| f.queued == 0 && f.in_flight == 0);
        self.stale |= idle;
    }

    /// One IO of `flow`, `bytes` long, was released. True: the flow has
    /// nothing else queued or in flight.
    pub fn released(&mut self, flow: u64, bytes: u64) -> bool {
        let Some(f) = self.dequeued(flow, bytes) else {
            return false;
        };
        let lone = f.queued == 0 && f.in_flight == 0;
        f.in_flight += bytes;
        // Idle only when the IO had no bytes.
        let idle = lone && f.in_flight == 0;
        self.stale |= idle;
        lone
    }

    /// Each host's window and queued bytes here, for pooling with the other
    /// reactors (hosts gone since the last call report zeros once).
    pub fn each_host(&mut self, mut publish: impl FnMut(u64, u64, u64)) {
        for host in self.gone.drain(..) {
            publish(host, 0, 0);
        }
        for (&id, h) in self.hosts.iter_mut().filter(|(_, h)| h.pooled) {
            publish(id, h.window, h.queued);
            h.published = h.window;
        }
        self.unpublished = false;
    }

    /// `bytes` of `flow` (`paced` of them by link share) entered the
    /// pipeline.
    pub fn enter_pipe(&mut self, flow: u64, bytes: u64, paced: u64, now: Nanos) {
        let Some(f) = self.map.get_mut(&flow) else {
            return;
        };
        if f.piped == 0 {
            f.progress_at = now;
        }
        f.piped += bytes;
        f.piped_paced += paced;
        if f.drain == Drain::Draining {
            self.hosts.entry(f.host).or_default().piped += bytes;
            self.paced_total += paced;
            self.pools.enter(f.pool, bytes);
        }
    }

    /// `bytes` of `flow` (`paced` by link share) left the pipeline.
    pub fn leave_pipe(&mut self, flow: u64, bytes: u64, paced: u64) {
        let Some(f) = self.map.get_mut(&flow) else {
            return;
        };
        debug_assert!(f.piped >= bytes && f.piped_paced >= paced);
        f.piped -= bytes;
        f.piped_paced -= paced;
        if f.drain == Drain::Draining {
            let host = self.hosts.entry(f.host).or_default();
            debug_assert!(host.piped >= bytes && self.paced_total >= paced);
            host.piped -= bytes;
            self.paced_total -= paced;
            self.pools.leave(f.pool, bytes);
        }
    }

    /// A released IO of `flow` left the flight (done or cancelled), after
    /// `leave_pipe` if it had entered it.
    pub fn landed(&mut self, flow: u64, bytes: u64) {
        if let Some(f) = self.map.get_mut(&flow) {
            debug_assert!(
                f.in_flight >= bytes,
                "flow {flow}: landed more than it held"
            );
            f.in_flight -= bytes;
            self.stale |= f.queued == 0 && f.in_flight == 0;
        }
    }

    /// The link share of every draining flow's bytes in the pipeline: what
    /// the reactor's window bounds.
    pub fn paced_total(&self) -> u64 {
        self.paced_total
    }

    /// A released IO's data has left (after `landed`): the flow's rate
    /// and window learn it, and a stalled flow drains again.
    pub fn delivered(&mut self, flow: u64, landing: Landing, now: Nanos, sizing: Sizing) {
        let Some(f) = self.map.get_mut(&flow) else {
            return;
        };
        let bytes = landing.bytes;
        f.split.add(landing);
        if let Some(h) = sizing.hold.or(sizing.latency) {
            f.hold_sum += bytes as f64 * h as f64;
            f.hold_bytes += bytes;
        }
        f.progress_at = now;
        if f.drain == Drain::Stalled {
            f.drain = Drain::Draining;
            self.stale = true;
            self.hosts.entry(f.host).or_default().piped += f.piped;
            self.paced_total += f.piped_paced;
            self.pools.enter(f.pool, f.piped);
        }
        f.delivered += bytes;
        if !f.rate.offer(now, f.delivered, RATE_SAMPLE_NS) {
            return;
        }
        // Its rate, and with it its window, may change.
        self.stale = true;
        f.samples += 1;
        f.split.sample();
        if f.hold_bytes > 0 {
            let mean = f.hold_sum / f.hold_bytes as f64;
            f.hold = Some(f.hold.map_or(mean, |h| h + (mean - h) * SAMPLE_WEIGHT));
            (f.hold_sum, f.hold_bytes) = (0.0, 0);
        }
        let hold = f.hold.map(|h| h as Nanos);
        if let (Some(r), Some(l)) = (f.rate.get(), sizing.latency.max(hold)) {
            // As the reactor's window: one sample in PROBE_EVERY admits a
            // little more, to find a rate that has grown.
            let probe = if f.samples.is_multiple_of(PROBE_EVERY) {
                PROBE_GAIN
            } else {
                1.0
            };
            let w = (sizing.gain * probe * r * l as f64 / 1e9) as u64;
            let own = sizing.queued.map_or(w, |q| {
                w.max((sizing.gain * probe * r * q as f64 / 1e9) as u64)
            });
            let min = FLOW_MIN_IOS * sizing.max_io;
            f.window = own.clamp(min, sizing.max_window.max(min));
            f.bdp = Some(w.min(sizing.max_window));
        }
    }

    /// Flows with IO in the pipeline and no progress for `STALL_NS` have
    /// stalled: their IO leaves their hosts' and the reactor's windows.
    /// True if one did.
    pub fn mark_stalls(&mut self, now: Nanos) -> bool {
        if ablate::out(Mechanism::Stall) {
            return false;
        }
        let mut any = false;
        for f in self.map.values_mut() {
            if f.drain == Drain::Draining && f.piped > 0 && now > f.progress_at + STALL_NS {
                f.drain = Drain::Stalled;
                let host = self.hosts.entry(f.host).or_default();
                debug_assert!(host.piped >= f.piped && self.paced_total >= f.piped_paced);
                host.piped -= f.piped;
                self.paced_total -= f.piped_paced;
                self.pools.leave(f.pool, f.piped);
                any = true;
            }
        }
        self.stale |= any;
        any
    }

    /// When the next flow would stall if nothing moves (None: no draining
    /// flow has IO in the pipeline).
    pub fn next_stall(&self) -> Option<Nanos> {
        self.map
            .values()
            .filter(|f| f.drain == Drain::Draining && f.piped > 0)
            .map(|f| f.progress_at + STALL_NS + 1)
            .min()
    }

    /// `flow` may release one more IO of `bytes`: its window has room, or
    /// it has nothing in flight; and its host's window has room, or its
    /// host has nothing in the pipeline.
    /// `host_window` gives a host's window here from its own (pooled with
    /// the other reactors'), and `deepen` the window in effect from one
    /// sized as a pipe's (see [`depth`](super::depth)). Failing those, a
    /// device-bound flow may go within its fair part (see `fair`) of the
    /// two windows `fair_windows` gives for its device: the device's
    /// (device-ns) and the reactor's (bytes).
    pub fn open(
        &self,
        flow: u64,
        bytes: u64,
        deepen: impl Fn(u64) -> u64,
        host_window: impl Fn(u64, u64) -> u64,
        fair_windows: impl Fn(usize) -> (DeviceNs, u64),
    ) -> bool {
        let Some(f) = self.map.get(&flow) else {
            return true;
        };
        let host = self.hosts.get(&f.host);
        if let Some(p) = f.pool {
            // Behind a full port the pool's window and the tenants' order
            // divide the port, not what TCP gave each flow (see `pools`).
            let own = f.in_flight == 0 || f.in_flight + bytes <= deepen(f.pool_cap);
            let host_own =
                host.is_none_or(|h| h.piped == 0 || h.piped + bytes <= deepen(h.pool_cap));
            return own && host_own && self.pools.open(p, bytes, &deepen);
        }
        let window = deepen(f.window.max(host.map_or(0, |h| h.flow_floor)));
        let own = f.in_flight == 0 || f.in_flight + bytes <= window;
        let windows = own
            && host.is_none_or(|h| {
                let window = if h.pooled {
                    host_window(f.host, h.window)
                } else {
                    h.window
                };
                h.piped == 0 || h.piped + bytes <= deepen(window)
            });
        // A device-bound flow may hold its part of its device's window
        // (device-ns) and of the reactor's (bytes), whatever its own and
        // its host's (see `fair`).
        let fair = |part: f64| {
            let (device, reactor) = fair_windows(f.device);
            let bytes = f.split.bytes(DeviceNs::from_f64(part * device.as_f64()))?;
            Some(bytes.min((part * reactor as f64) as u64))
        };
        windows || (self.fair.part(flow).and_then(fair)).is_some_and(|b| f.in_flight + bytes <= b)
    }

    /// `flow`'s host has another flow with IO queued or in flight on a
    /// device that `fast` names.
    pub fn host_also_on(&self, flow: u64, fast: impl Fn(usize) -> bool) -> bool {
        let Some(host) = self.map.get(&flow).map(|f| f.host) else {
            return false;
        };
        self.map.iter().any(|(&id, f)| {
            id != flow && f.host == host && (f.queued > 0 || f.in_flight > 0) && fast(f.device)
        })
    }

    /// Sizes each host's window from its active flows (those with IO queued
    /// or in flight), and returns their sum: the reactor's window. `shared`
    /// names the full port a flow (its id, its device) came in on, where
    /// it may pool (None: its port has room or is unknown, or it may not);
    /// measured flows on one full port pool their windows (see
    /// [`pools`](super::pools)).
    pub fn window_sum(
        &mut self,
        floors: Floors,
        shared: impl Fn(u64, usize) -> Option<usize>,
        weight: impl Fn(usize) -> f64,
    ) -> u64 {
        // Few passes over the maps: this runs on every completion and poll.
        for h in self.hosts.values_mut() {
            (h.window, h.flows, h.flow_floor) = (0, 0, 0);
            h.pooled_sum = None;
        }
        let mut network = 0;
        for f in self.map.values() {
            if f.queued > 0 || f.in_flight > 0 {
                let h = self.hosts.entry(f.host).or_default();
                // A flow not yet measured counts its starting window.
                h.window += f.bdp.unwrap_or(f.window);
                h.flows += 1;
                network += u64::from(h.flows == 1 && h.pooled);
            }
        }
        self.stale = false;
        let shared_part = floors.shared / network.max(1);
        let mut sum = 0;
        for h in self.hosts.values_mut().filter(|h| h.flows > 0) {
            let mut floor = floors.host;
            if h.pooled {
                floor = floor.max(shared_part);
                h.flow_floor = shared_part / h.flows;
                self.unpublished |= h.published == 0;
            }
            h.window = h.window.max(floor);
            sum += h.window;
        }
        self.pool_flows(shared, sum);
        self.divide_devices(weight);
        sum
    }

    /// Each active, device-bound flow's part of its device (see
    /// [`fair`](super::fair)); pooled flows take the port pool's instead.
    fn divide_devices(&mut self, weight: impl Fn(usize) -> f64) {
        let on = !ablate::out(Mechanism::FairPart);
        let members = self.map.iter().filter(|(_, f)| {
            on && (f.queued > 0 || f.in_flight > 0) && f.pool.is_none() && f.split.device_bound()
        });
        let members = members.map(|(&flow, f)| Member {
            flow,
            device: f.device,
            tenant: f.tenant,
            host: f.host,
        });
        self.fair.divide(members, weight);
    }

    /// Puts each active, measured flow on a full port in its port's pool,
    /// with its own window (as its flow's and its host's would bound it),
    /// and sets each one's cap there.
    fn pool_flows(&mut self, shared: impl Fn(u64, usize) -> Option<usize>, reactor: u64) {
        if !self.pools.is_empty() {
            self.pools.clear();
        }
        let mut any = false;
        for (&id, f) in self.map.iter_mut() {
            let active = f.queued > 0 || f.in_flight > 0;
            let rate = f.rate.get().filter(|_| active);
            f.pool = rate.and_then(|_| shared(id, f.device));
            let (Some(p), Some(rate)) = (f.pool, rate) else {
                continue;
            };
            any = true;
            let h = &self.hosts[&f.host];
            let own = f.window.max(h.flow_floor).min(h.window);
            let piped = if f.drain == Drain::Draining {
                f.piped
            } else {
                0
            };
            self.pools.join(p, f.tenant, own, rate, piped);
        }
        // No flow pooled: nothing below would change (every host's
        // `pooled_sum` was reset in `window_sum`).
        if any {
            self.cap_pooled(reactor);
        }
    }

    /// A host's pooled flows are capped together too: each flow with
    /// nothing in flight may send one IO, and a host with a flow per
    /// drive, held by its own slower link, filled the pool with IO
    /// waiting for that link (`tenants_own_link`: 15 IOs where its link
    /// needed 2, and the port's other hosts got 57% of their share).
    fn cap_pooled(&mut self, reactor: u64) {
        for f in self.map.values_mut() {
            f.pool = f.pool.filter(|&p| self.pools.shared(p));
            if let (Some(p), Some(rate)) = (f.pool, f.rate.get()) {
                let bdp = f.bdp.unwrap_or(0);
                f.pool_cap = self.pools.cap(p, rate, bdp, reactor);
                let host = self.hosts.entry(f.host).or_default();
                let (_, r, b) = host.pooled_sum.get_or_insert((p, 0.0, 0));
                (*r, *b) = (*r + rate, *b + bdp);
            }
        }
        for h in self.hosts.values_mut() {
            if let Some((p, rate, bdp)) = h.pooled_sum {
                h.pool_cap = self.pools.cap(p, rate, bdp, reactor);
            }
        }
    }

    /// `flow` is in a full port's pool (see [`pools`](super::pools)).
    pub fn pooled(&self, flow: u64) -> bool {
        self.map.get(&flow).is_some_and(|f| f.pool.is_some())
    }

    /// `flow` holds all its pool lets it (see [`pools`](super::pools)):
    /// what holds it back is its own rate, not the port it shares.
    pub fn at_pool_cap(&self, flow: u64, bytes: u64, deepen: impl Fn(u64) -> u64) -> bool {
        self.map.get(&flow).is_some_and(|f| {
            let host = self.hosts.get(&f.host);
            let host_full =
                host.is_some_and(|h| h.piped > 0 && h.piped + bytes > deepen(h.pool_cap));
            let flow_full = f.in_flight > 0 && f.in_flight + bytes > deepen(f.pool_cap);
            f.pool.is_some() && (flow_full || host_full)
        })
    }

    /// A host that just became active has a window the other reactors have
    /// not seen: they would pool it as 0, and its first burst would go out
    /// one IO at a time until one of its IOs completes.
    pub fn unpublished(&self) -> bool {
        self.unpublished
    }

    /// Forgets `flow` (its connection closed, its IOs cancelled before).
    pub fn close(&mut self, flow: u64) {
        self.stale = true;
        self.host_of.remove(&flow);
        if let Some(f) = self.map.remove(&flow) {
            debug_assert!(
                f.queued == 0 && f.in_flight == 0 && f.piped == 0,
                "flow {flow} closed with IO still queued or in flight"
            );
            let idle = self.map.values().all(|g| g.host != f.host);
            if idle && self.hosts.remove(&f.host).is_some_and(|h| h.pooled) {
                self.gone.push(f.host);
            }
        }
    }
}

#[cfg(test)]
mod tests;
