//! `auto` mode's window: bytes in flight are held near what the pipeline
//! needs, `gain x (max delivered rate) x (min release-to-done latency)`,
//! measured from completions, with one window per device so a slow device
//! cannot take the buffers fast ones need (in device time: see
//! `device_window`), and the reactors' windows pooled
//! (see [`LinkWindow`](super::LinkWindow)). Every `LATENCY_PROBE_EVERY_NS`
//! the window drains briefly, so the min latency is measured on an empty
//! pipeline and not on the queue the window itself keeps.

use std::sync::Arc;

use super::ablate::{self, Mechanism};
use super::depth::{Factors, Sample, SharedDepth};
use super::device_share::Split;
use super::drr::{Device, Scheduler, FAST_HOLD_RATIO};
use super::fair::Landing;
use super::filter::{rate_filter, LargeIoMin, WindowedMax};
use super::filter::{LATENCY_WINDOW_NS, RATE_SAMPLE_NS};
use super::ports::PortMeter;
use super::queues::{PollMemo, Slot};
use super::tenants::Tenants;
use super::{flows::Flows, sizing::Sizing};
use super::{DeviceNs, DeviceShares, Flight, LinkWindow, Mode, PacedIo, PacingConfig, PortLoad};
use crate::Nanos;

mod resize;

/// How often `auto` looks for flows that stopped draining (see
/// [`flows`](super::flows)).
const STALL_CHECK_NS: Nanos = 1_000_000;

/// How often `auto` drains its window to re-measure the unqueued latency:
/// twice per min-latency window, so every window holds a drained sample.
pub(super) const LATENCY_PROBE_EVERY_NS: Nanos = LATENCY_WINDOW_NS / 2;

/// The drain lasts this many min latencies (the queue empties, then IOs
/// released into the empty pipeline complete), within these bounds.
pub(super) const LATENCY_PROBE_LATENCIES: u64 = 4;

const LATENCY_PROBE_MIN_NS: Nanos = 50_000;

pub(super) const LATENCY_PROBE_MAX_NS: Nanos = 2_000_000;

/// `auto`'s windows and what sizes them: the reactor's, each device's
/// (over the [`Scheduler`]'s devices) and each connection's, pooled with
/// the other reactors' and bounded by the ports'. Its methods take the
/// pacer's config and scheduler, whose state they read.
pub(super) struct Windows {
    /// Each connection's drain rate and window.
    pub flows: Flows,
    /// When flows are next checked for stalls.
    stall_check_at: Nanos,
    /// The max delivered rate and the min release-to-done latency of the
    /// largest IOs: the path's product.
    pub rate: WindowedMax,
    pub latency: LargeIoMin,
    /// The fastest device's hold, for hold ratios: as `latency`, with each
    /// device's own largest IOs counted too (see `Pacer::on_complete`).
    pub fastest: LargeIoMin,
    /// How many times its windows the pipeline wants (see
    /// [`depth`](super::depth)): its own or the target's, and the factors.
    depth: Arc<SharedDepth>,
    pub depth_now: Factors,
    pub window: u64,
    /// The window in effect for this poll: `window`, or this reactor's part
    /// of every reactor's (see [`LinkWindow`]).
    window_now: u64,
    /// All reactors' windows, and this reactor's index in them.
    link: Option<(Arc<LinkWindow>, usize)>,
    /// Each device's rate over all reactors (see `device_share`).
    device_shares: Option<Arc<DeviceShares>>,
    /// The ports' capacities and load, where the target knows them.
    ports: Option<PortMeter>,
    /// The largest IO seen (at least one buffer): DRR's quantum, and what
    /// counts as a large IO for the latency estimate.
    pub max_io: u64,
    /// What `window` was last summed from, while nothing else it reads
    /// can change unseen (see `resize`).
    sum_key: Option<resize::SumKey>,
    /// Which answers a poll keeps (see `PollMemo`).
    pub poll_memo: PollMemo,
}

impl Windows {
    /// Windows over `devices` device queues, none measured yet, with
    /// `max_io` the largest IO expected.
    pub fn new(devices: usize, max_io: u64, now: Nanos) -> Windows {
        Windows {
            flows: Flows::default(),
            stall_check_at: now,
            rate: rate_filter(max_io),
            latency: LargeIoMin::new(LATENCY_WINDOW_NS),
            fastest: LargeIoMin::new(LATENCY_WINDOW_NS),
            depth: SharedDepth::new(devices.max(1)),
            depth_now: Factors::default(),
            window: 4 * max_io,
            window_now: 4 * max_io,
            link: None,
            device_shares: None,
            ports: None,
            max_io,
            sum_key: None,
            poll_memo: PollMemo::default(),
        }
    }

    /// This reactor's index among those pooling their windows.
    pub fn reactor(&self) -> Option<usize> {
        self.link.as_ref().map(|(_, r)| *r)
    }

    /// A client sending one IO at a time queued one at device `d`.
    pub fn lone_io(&self, d: usize, now: Nanos) {
        self.depth.lone_io(d, now);
    }

    /// The mode changed: the depth learned for the old one does not hold.
    pub fn reset_depth(&self) {
        self.depth.reset();
    }

    /// Splits each device's rate with the other reactors' pacers.
    pub fn share_devices(&mut self, shares: Arc<DeviceShares>) {
        self.device_shares = Some(shares);
    }

    /// Measures the target's ports, shared with the other reactors' pacers.
    pub fn share_ports(&mut self, load: Arc<PortLoad>, now: Nanos) {
        if !ablate::out(Mechanism::Ports) {
            self.ports = Some(PortMeter::new(load, now));
        }
    }

    /// Flow `flow` came in on port `port` (see [`PortLoad`]).
    pub fn flow_port(&mut self, flow: u64, port: usize) {
        if let Some(m) = &mut self.ports {
            m.join(flow, port);
        }
    }

    /// Tenants `t` and `u` may share a full link: both have flows on a
    /// full port, or the ports are not known (then every link may be
    /// shared, as before the pacer knew ports).
    pub fn may_share_link(&self, t: usize, u: usize) -> bool {
        self.ports.as_ref().is_none_or(|m| m.share_full_port(t, u))
    }

    /// Flow `flow` carries tenant `tenant`'s IO (see `PortMeter::tenant`).
    pub fn flow_tenant(&mut self, flow: u64, tenant: usize) {
        if let Some(m) = &mut self.ports {
            m.tenant(flow, tenant);
        }
    }

    /// Forgets flow `flow` (its connection closed).
    pub fn close_flow(&mut self, flow: u64) {
        self.flows.close(flow);
        if let Some(m) = &mut self.ports {
            m.leave(flow);
        }
    }

    /// Takes the ports' load for this poll.
    pub fn sample_ports(&mut self, now: Nanos) {
        if let Some(m) = &mut self.ports {
            m.sample(now, self.max_io);
        }
    }

    /// In `auto`, looks for flows that stopped draining, once per
    /// `STALL_CHECK_NS`.
    pub fn check_stalls(&mut self, cfg: &PacingConfig, now: Nanos) {
        if cfg.mode == Mode::Auto && now >= self.stall_check_at {
            self.flows.mark_stalls(now);
            self.stall_check_at = now + STALL_CHECK_NS;
        }
    }

    /// When a flow will have stalled, freeing windows with no completion
    /// to say so (`auto` only).
    pub fn next_stall_check(&self, cfg: &PacingConfig) -> Option<Nanos> {
        if cfg.mode != Mode::Auto {
            return None;
        }
        self.flows.next_stall().map(|t| t.max(self.stall_check_at))
    }

    /// Flow `flow`'s link is its own as far as the ports tell (see
    /// `ports.rs`): its port is known and has room.
    pub fn own_link(&self, flow: u64) -> bool {
        self.ports.as_ref().is_some_and(|m| m.own_link(flow))
    }

    /// No other tenant shares `flow`'s link (see
    /// `PortMeter::tenants_own_link`).
    pub fn tenants_own_link(&self, flow: u64) -> bool {
        self.ports
            .as_ref()
            .is_some_and(|m| m.tenants_own_link(flow))
    }

    /// Device `d` keeps a queue of its own (see `queues_at_device`): its
    /// flows' windows are full because the device is slow to serve them,
    /// not because their links are.
    pub fn device_bound(&self, devices: &[Device], d: usize) -> bool {
        let dev = &devices[d];
        dev.queues_at_device(dev.largest_work(self.max_io))
    }

    /// Tenant `t`'s oldest IO at device `d` whose flow may take it now.
    /// Within a poll each flow's answer is kept until a release (see
    /// `PollMemo`).
    pub fn head(&self, cfg: &PacingConfig, sched: &Scheduler, d: usize, t: usize) -> Option<Slot> {
        let (queue, open) = (&sched.devices[d].queue, |io: &PacedIo| {
            self.flow_open(cfg, sched, io)
        });
        let Some(gen) = self.poll_memo.gen() else {
            return queue.head(t, open);
        };
        let slot = queue.head_memo(t, gen, open);
        // Alone, a stale answer is a bug; with other reactors, what they
        // publish may move under a poll (the first answer is kept).
        debug_assert!(self.link.is_some() || slot == queue.head(t, open));
        slot
    }

    /// The IO's flow has room in its window (in `auto`; a light tenant's IO
    /// goes past full windows, see `Tenants::light`).
    pub fn flow_open(&self, cfg: &PacingConfig, sched: &Scheduler, io: &PacedIo) -> bool {
        cfg.mode != Mode::Auto
            || sched.tenants.light(io.tenant)
            || self.flows.open(
                io.flow,
                u64::from(io.bytes),
                |window| self.deepen_at(cfg, &sched.devices, io.device, window),
                |host, own| {
                    self.link
                        .as_ref()
                        .map_or(own, |(link, r)| link.host_share(*r, host, own))
                },
                |d| (self.device_window(cfg, &sched.devices, d), self.window_now),
            )
    }

    /// The completed IO `f`'s port carried its bytes.
    pub fn port_delivered(&self, f: &Flight) {
        if let Some(m) = &self.ports {
            m.delivered(f.flow, f.kind, f.bytes);
        }
    }

    /// The completed IO `f`'s data has left: its flow's window is sized
    /// anew, and with it the reactor's.
    pub fn flow_delivered(
        &mut self,
        cfg: &PacingConfig,
        sched: &Scheduler,
        f: &Flight,
        now: Nanos,
    ) {
        let sizing = Sizing {
            hold: self.flow_hold(cfg, sched, f.device, f.flow),
            queued: self.queued_hold(&sched.devices, f.device),
            ..self.sizing(cfg)
        };
        // The device's clock and ours may differ by a tick.
        let total = now - f.released_at;
        let landing = Landing {
            bytes: f.bytes,
            work: f.work,
            at_device: f.at_device.min(total),
            total,
        };
        self.flows.delivered(f.flow, landing, now, sizing);
        self.resize(cfg, sched);
        self.publish_link(&sched.tenants);
        self.publish_hosts();
    }

    /// The window in effect for this poll: this reactor's own or its part of
    /// the pooled one, and only half the path's rate x latency during a
    /// latency probe (the standing queue that gain builds drains, and the
    /// IOs released now see the bare latency).
    pub fn set_now(&mut self, cfg: &PacingConfig, sched: &mut Scheduler, now: Nanos) {
        self.resize(cfg, sched);
        let window = self
            .link
            .as_ref()
            .and_then(|(l, r)| l.share(*r))
            .map_or(self.window, |w| self.clamp_window(cfg, w, 2));
        if cfg.mode == Mode::Auto {
            // The other reactors' trials and lone clients move it: one lock
            // per poll, and none in the modes that have no windows.
            self.depth_now = self.depth.factors();
            // Draining orders IO only where weights have something to
            // order: two tenants busy, and a device holding more than twice
            // its own floor.
            let tenants = sched
                .tenants
                .iter()
                .filter(|t| t.in_flight > 0 || t.queued > 0);
            let weighed = tenants.count() > 1;
            for (d, dev) in sched.devices.iter_mut().enumerate() {
                dev.held = self.depth.held(d, now);
                let deep = weighed
                    && !ablate::out(Mechanism::DrainProbe)
                    && dev.probe.due(now)
                    && dev.in_flight_work > 4 * dev.largest_work(dev.largest_io.max(1));
                dev.probe.tick(deep, now);
            }
        }
        self.window_now = self.deepen(cfg, window);
        if self.probing_latency(cfg, now) {
            let bare = cfg.gain.max(1.0) * self.depth_factor(cfg);
            let half_bdp = self.window_now as f64 / (2.0 * bare);
            self.window_now = (half_bdp as u64).max(self.max_io);
        }
    }

    /// The factor `auto`'s windows take now (see [`depth`](super::depth)):
    /// 1 in the other modes.
    pub fn depth_factor(&self, cfg: &PacingConfig) -> f64 {
        if cfg.mode == Mode::Auto && !ablate::out(Mechanism::Depth) {
            self.depth_now.now
        } else {
            1.0
        }
    }

    /// `window` times the depth factor, up to `max_window` (but not below
    /// `window`).
    pub fn deepen(&self, cfg: &PacingConfig, window: u64) -> u64 {
        let deep = (window as f64 * self.depth_factor(cfg)) as u64;
        deep.min(cfg.max_window).max(window)
    }

    /// A window for IO to device `d`: deepened, unless a lone client holds
    /// the device at depth 1.
    pub fn deepen_at(&self, cfg: &PacingConfig, devices: &[Device], d: usize, window: u64) -> u64 {
        if devices[d].held {
            window
        } else {
            self.deepen(cfg, window)
        }
    }

    /// IO `f` completed `held` after its release: the depth learns whether
    /// more in flight delivers more. `backlogged`: IO waits in the pacer,
    /// or will (a write piece's payload is arriving).
    pub fn learn_depth(
        &mut self,
        cfg: &PacingConfig,
        devices: &[Device],
        f: &Flight,
        held: Nanos,
        backlogged: bool,
        now: Nanos,
    ) {
        if cfg.mode != Mode::Auto {
            return;
        }
        let sample = Sample {
            now,
            bytes: f.bytes,
            held,
            at_device: f.at_device,
            backlogged,
            probing: self.probing_latency(cfg, now),
            lone: f.lone,
            device_held: devices[f.device].held,
        };
        self.depth_now = self.depth.completed(sample);
    }

    /// Learns the depth with the other reactors' pacers (one
    /// [`SharedDepth`] for all of them).
    pub fn share_depth(&mut self, depth: Arc<SharedDepth>) {
        self.depth = depth;
    }

    /// `auto` is in a latency probe: the window drains for a moment so the
    /// min-latency estimate sees an empty pipeline. Without it, a window of
    /// gain x rate x latency keeps a standing queue, each min-latency epoch
    /// measures that queue, and the window it sizes grows with it. Every
    /// reactor reads the same clock, so they drain together and the queue
    /// they share empties.
    pub fn probing_latency(&self, cfg: &PacingConfig, now: Nanos) -> bool {
        !ablate::out(Mechanism::LatencyProbe) && self.probe_end(cfg, now).is_some()
    }

    /// When the latency probe under way ends (None: none is under way, or
    /// `auto` has no latency to size one with yet).
    pub fn probe_end(&self, cfg: &PacingConfig, now: Nanos) -> Option<Nanos> {
        if cfg.mode != Mode::Auto {
            return None;
        }
        let lat = self.latency.get()?;
        let len = (LATENCY_PROBE_LATENCIES * lat).clamp(LATENCY_PROBE_MIN_NS, LATENCY_PROBE_MAX_NS);
        // A deeper pipeline takes longer to drain: without the time, the
        // min latency measured its queue, and the windows grew with it.
        let len = ((len as f64 * self.depth_now.learned) as Nanos).min(2 * LATENCY_PROBE_MAX_NS);
        let end = now - now % LATENCY_PROBE_EVERY_NS + len;
        (now < end).then_some(end)
    }

    /// The shared window has room for one more IO of `bytes` to device `d`.
    /// `paced` is its link share (see `link_share`).
    pub fn shared_window_open(
        &self,
        cfg: &PacingConfig,
        tenants: &Tenants,
        t: usize,
        paced: u64,
        bytes: u64,
        in_flight: u64,
    ) -> bool {
        let piped = self.flows.paced_total();
        piped == 0
            || tenants.light(t)
            || (piped + paced <= self.window_now && in_flight + bytes <= cfg.max_window)
    }

    /// Device `d`'s own window has room for `io`.
    pub fn device_window_open(
        &self,
        cfg: &PacingConfig,
        sched: &Scheduler,
        d: usize,
        io: &PacedIo,
    ) -> bool {
        let dev = &sched.devices[d];
        if let Some(open) = dev.probe.admits(dev.in_flight_ios) {
            return open || sched.tenants.light(io.tenant);
        }
        // Behind a full port a device that keeps no queue of its own is
        // not what binds: its window, sized from what its flows drain
        // (the port's split between their sockets), would hold each
        // tenant's device to that split as a flow's window did (see
        // `pools`; only flows at fast devices pool). The pool bounds its
        // flows instead.
        let devices = &sched.devices;
        let port_bound = || self.flows.pooled(io.flow) && !self.device_bound(devices, d);
        dev.in_flight_work == DeviceNs::ZERO
            || sched.tenants.light(io.tenant)
            || dev.in_flight_work + dev.work(io.kind, u64::from(io.bytes))
                <= self.device_window(cfg, devices, d)
            || port_bound()
    }

    /// Device `d`'s window, in device time (ns): gain x the device time
    /// it delivers a second x its hold time, deepened unless a lone client
    /// holds it (see `deepen_at`), and room for two of the largest IO.
    /// (Its bytes are bounded by the reactor's `max_window`.) Counted in
    /// bytes, 4 KiB reads each costing a drive 20 us beside 256 KiB ones
    /// costing 64 us filled its window 60 at a time: the large reads'
    /// flows waited behind them, their windows shrank to what they got,
    /// and their hosts, waiting on that drive, left slow drives idle
    /// (`slow_devices_open_link`: 29 of 47 Gb/s at QD 128).
    pub fn device_window(&self, cfg: &PacingConfig, devices: &[Device], d: usize) -> DeviceNs {
        // Asked for each IO a poll looks at: kept as flows' answers are.
        let window = || self.device_window_of(cfg, devices, d);
        let w = self.poll_memo.keep(&devices[d].window_memo, window);
        debug_assert!(self.link.is_some() || w == window(), "device {d}: stale");
        w
    }

    /// `device_window`, worked out anew.
    fn device_window_of(&self, cfg: &PacingConfig, devices: &[Device], d: usize) -> DeviceNs {
        let dev = &devices[d];
        let max_io = dev.largest_work(self.max_io);
        // A drained device has room for two of the largest IO it was sent,
        // not of the reactor's: two 128 KiB buffers' device time held 64
        // IOs of 4 KiB at a drive serving one at a time, which then kept
        // the queue. Elsewhere the larger floor stays: a reactor's device
        // window follows its own rate, and a small floor let a reactor of
        // 64 KiB writers fall to a third of its share of a shared drive.
        let own_largest = match dev.probe.latency_alone(dev.largest_io) {
            Some(_) => dev.largest_work(dev.largest_io),
            None => max_io,
        };
        match (dev.rate.get(), self.device_hold(devices, d)) {
            (Some(r), Some(l)) => {
                let depth = if dev.held {
                    1.0
                } else {
                    self.depth_factor(cfg)
                };
                let product = |rate: f64| cfg.gain * depth * rate * l as f64 / 1e9;
                let w = match self.device_split(d) {
                    // Its part, and what the other reactors leave free.
                    Some(s) => product(s.part).max(product(s.total) - s.others_in_flight.as_f64()),
                    None => product(r),
                };
                DeviceNs::from_f64(w).max(dev.window_floor(own_largest))
            }
            // Until it has delivered, a device may fill the whole window.
            _ => DeviceNs::from_f64(self.window_now as f64 * max_io.as_f64() / self.max_io as f64),
        }
    }

    /// Pools this pacer's window with the other reactors' (one
    /// [`LinkWindow`] for all of them; `reactor` is this one's index).
    pub fn share_link(&mut self, link: Arc<LinkWindow>, reactor: usize, tenants: &Tenants) {
        // One reactor has nothing to pool with: no shared writes per IO.
        if reactor < link.reactors() && link.reactors() > 1 {
            self.link = Some((link, reactor));
            self.publish_link(tenants);
        }
    }

    /// Publishes this reactor's window and the bytes it could release: a
    /// tenant held back for another reactor's does not claim link.
    pub fn publish_link(&self, tenants: &Tenants) {
        if let Some((link, r)) = &self.link {
            let backlog = tenants
                .iter()
                .filter(|t| !t.held)
                .map(|t| t.queued_bytes)
                .sum();
            link.publish(*r, self.window, backlog, self.flows.paced_total());
            if tenants.len() > 1 {
                let queued = tenants.iter();
                link.publish_tenants(*r, queued.map(|t| if t.held { 0 } else { t.queued_bytes }));
            }
        }
    }

    /// Publishes each host's window and queued bytes here, for pooling
    /// with the other reactors' (see [`LinkWindow::host_share`]).
    pub fn publish_hosts(&mut self) {
        if let Some((link, r)) = &self.link {
            self.flows
                .each_host(|host, window, queued| link.publish_host(*r, host, window, queued));
        }
    }

    /// The shared window is sized as the link's rate x the fastest device's
    /// latency, so it bounds the *rate* released: a device that holds its
    /// buffers k times longer delivers its bytes k times more slowly, and
    /// counts 1/k of them. (Its real bytes are bounded by `max_window` and
    /// its own window.)
    pub fn link_share(&self, cfg: &PacingConfig, devices: &[Device], d: usize, bytes: u64) -> u64 {
        super::ceil_u64(bytes as f64 / self.link_ratio(cfg, devices, d))
    }

    /// The hold ratio in `auto`; 1 in the modes without windows.
    pub fn link_ratio(&self, cfg: &PacingConfig, devices: &[Device], d: usize) -> f64 {
        if cfg.mode == Mode::Auto {
            self.hold_ratio(devices, d)
        } else {
            1.0
        }
    }

    /// How long device `d`'s IOs need their buffers: the min release-to-done
    /// time, but no more than its time at the device plus the fastest
    /// release-to-done (the send path). A flow whose replies always queue
    /// behind a slow wire never sees its unqueued latency; without the bound,
    /// its window would grow with the queue it makes.
    pub fn hold_time(&self, devices: &[Device], d: usize) -> Option<u64> {
        devices[d].hold(self.fastest.get())
    }

    /// How long device `d` holds an IO, for sizing its window: its hold
    /// time, or less if its largest IO alone (see `DrainProbe`) showed that
    /// the hold time measured is its own queue.
    fn device_hold(&self, devices: &[Device], d: usize) -> Option<Nanos> {
        let held = self.hold_time(devices, d)?;
        let dev = &devices[d];
        match (dev.probe.latency_alone(dev.largest_io), self.fastest.get()) {
            (Some(alone), Some(fastest)) => Some(held.min(alone + fastest)),
            _ => Some(held),
        }
    }

    /// How much longer than the fastest device this device holds its
    /// buffers (the reactor's min latency is the fastest device's).
    pub fn hold_ratio(&self, devices: &[Device], d: usize) -> f64 {
        if ablate::out(Mechanism::HoldRatio) {
            return 1.0;
        }
        // Asked for each IO a poll looks at: kept as flows' answers are.
        let ratio = || devices[d].hold_ratio(self.fastest.get()).to_bits();
        let r = self.poll_memo.keep(&devices[d].ratio_memo, ratio);
        debug_assert_eq!(r, ratio(), "device {d}: a stale hold ratio");
        f64::from_bits(r)
    }

    /// How long an IO to device `d` holds its flow's window, for sizing
    /// the flow's (None: the reactor's min latency). A slow device's own
    /// hold time, unless a fast device has IO that only the shared window
    /// holds back (IO on a link that may be shared: a fast host held by
    /// its own slow link, on a port with room, asks nothing of the others,
    /// and yielding to it held hosts on 5 ms drives to a third of their
    /// share): then slow devices yield the link to fast ones (their
    /// share falls as 1/latency, see `release`), and a flow's window sized
    /// on their hold time took it back (`test11_delay16`: fast devices 171
    /// of 185 Gb/s, not 177.5). A fast device that keeps a queue of its own
    /// is bound by itself, not the link, and takes no yield: slow flows
    /// sized on its latency shrank their windows each sample, and a slow
    /// drive beside a saturated fast one idled (26 of 48 Gb/s in a random
    /// scenario). Only a flow whose host has no IO at fast devices
    /// yields: within one host the yield gives the host's link to itself,
    /// and where each host spread its IO over slow and fast drives, its
    /// fast IO waited on its own host window, which the yield had shrunk
    /// (`mixed_drives_open_port`: 44.5 of 83.8 Gb/s at QD 128). Devices
    /// within `FAST_HOLD_RATIO` of the fastest count as the fastest: their
    /// own min latencies, each from fewer samples, sit above the
    /// reactor's, and flows on them held a third more.
    pub fn flow_hold(
        &self,
        cfg: &PacingConfig,
        sched: &Scheduler,
        d: usize,
        flow: u64,
    ) -> Option<Nanos> {
        // Only `auto` sizes flows' windows: no scan per completion in the
        // other modes.
        if cfg.mode != Mode::Auto {
            return None;
        }
        let devices = &sched.devices;
        let fast = |e: usize| self.hold_ratio(devices, e) < FAST_HOLD_RATIO;
        let wants_link = |e: usize| {
            let dev = &devices[e];
            let max_io = dev.largest_work(self.max_io);
            dev.queue.len() > 0
                && dev.in_flight_work + max_io <= self.device_window(cfg, devices, e)
                && !dev.queues_at_device(max_io)
                && (0..sched.tenants.len())
                    .any(|t| dev.queue.head(t, |io| !self.own_link(io.flow)).is_some())
        };
        if fast(d) {
            return None;
        }
        let yielding = (0..devices.len()).any(|e| fast(e) && wants_link(e))
            && !self.flows.host_also_on(flow, fast);
        if yielding {
            return None;
        }
        self.hold_time(devices, d)
    }

    /// A device that keeps a queue of its own holds its IOs' buffers for
    /// its queue too: its hold time plus its mean wait past the least
    /// (None: it keeps none). Its flows' own windows allow for that
    /// (`Sizing::queued`), so the device's window, not theirs, bounds what
    /// waits there and its IOs go in their order of arrival: sized on the
    /// unqueued hold, each sample shrank them, and 1 MiB writers' flows to
    /// a drive busy with 4 KiB reads sat at their 2-piece floor while the
    /// reads took the drive (`writers_beside_small_readers`: 68.4 of 95.7
    /// Gb/s at QD 16). Their products, which the hosts' and the reactor's
    /// windows sum, stay on the unqueued hold: with them too, the whole
    /// window grew with the queue it let wait, the latency probe no longer
    /// drained it, and a 128 KiB QD 256 reader held 12.5 MiB at this
    /// machine's disk where it had held 2.2-6.4
    /// (`docs/evidence.md#queued-hold`).
    pub fn queued_hold(&self, devices: &[Device], d: usize) -> Option<Nanos> {
        let dev = &devices[d];
        if !dev.queues_at_device(dev.largest_work(self.max_io)) {
            return None;
        }
        let extra = dev.wait_mean? - dev.wait_min.get()? as f64;
        debug_assert!(extra > 0.0, "a device that queues waits past its least");
        Some(self.hold_time(devices, d)? + extra as Nanos)
    }

    /// Device `d` over all reactors, if they share it.
    fn device_split(&self, d: usize) -> Option<Split> {
        match (&self.device_shares, &self.link) {
            (Some(s), Some((_, r))) if !ablate::out(Mechanism::DeviceShare) => s.split(d, *r),
            _ => None,
        }
    }

    fn sizing(&self, cfg: &PacingConfig) -> Sizing {
        Sizing {
            gain: cfg.gain,
            max_io: self.max_io,
            max_window: cfg.max_window,
            latency: self.latency.get(),
            hold: None,
            queued: None,
        }
    }

    pub fn sample_rates(&mut self, devices: &mut [Device], now: Nanos) {
        let shares = self.device_shares.as_ref().zip(self.link.as_ref());
        for (i, d) in devices.iter_mut().enumerate() {
            d.rate.offer(now, d.delivered_work.0, RATE_SAMPLE_NS);
            if let Some((s, (_, r))) = shares {
                let rate = d.rate.get().unwrap_or(0.0);
                s.publish(i, *r, rate, d.queue.flows(), d.in_flight_work);
            }
        }
        let delivered: u64 = devices.iter().map(|d| d.delivered).sum();
        self.rate.offer(now, delivered, RATE_SAMPLE_NS);
    }
}
