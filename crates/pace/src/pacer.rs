//! The pacer: decides when each queued IO may take buffers and go to its
//! device. One per reactor, driven with an injected clock, so the target and
//! the simulator run the same code.
//!
//! Call order for one IO: [`Pacer::enqueue`] → (released by [`Pacer::poll`])
//! → [`Pacer::on_device_complete`] → [`Pacer::on_complete`] when its data
//! has left (reply sent). [`Pacer::cancel`] removes an IO still queued.
//!
//! Modes:
//! - `none` and `buffers`: every IO is released at once (`buffers` relies on
//!   the buffer pool's limit alone, the seed's method 1).
//! - `rate`: the seed's method 2 — a byte credit every `period`, round robin
//!   over device queues, optional size threshold, per-device op credit, and
//!   the `io-rate` / `bytes-in-flight` period tuners. Credit from late polls
//!   is kept up to `burst` periods; queued IOs always leave eventually.
//! - `auto`: no period. Bytes in flight are held near what the pipeline
//!   needs: `gain x (max delivered rate) x (min release-to-done latency)`,
//!   measured from completions (the wire's drain), with one window per device
//!   so a slow device cannot take the buffers fast ones need.
//!   Every 100 ms the window drains briefly, so the min latency is measured
//!   on an empty pipeline and not on the queue the window itself keeps.
//!
//! In `rate` and `auto`, devices with latency targets (see [`qos`]) also
//! wait for device-time budget at their current vrate.
//!
//! In every mode, tenants share each release opportunity by weighted fair
//! queuing on virtual time over IO cost, and devices within a tenant by
//! deficit round robin.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Nanos;

mod config;
mod cost;
mod device_ops;
mod filter;
mod flows;
mod link_window;
mod qos;
mod queues;
mod tenant_clock;

pub use config::{Mode, PacingConfig, TenantConfig, Tuner};
pub use cost::CostModel;
pub use device_ops::DeviceOps;
use filter::{LargeIoMin, WindowedMax, WindowedMin};
use flows::{Flows, Sizing};
pub use link_window::LinkWindow;
pub use qos::{DeviceQos, QosConfig};
use queues::{DeviceQueue, Slot};
pub use tenant_clock::TenantClock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum IoKind {
    Read,
    Write,
}

/// One IO as the pacer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacedIo {
    pub id: u64,
    /// The connection it came on, unique over the reactor's life: what
    /// drains at its own rate (its socket, its host's link).
    pub flow: u64,
    pub device: usize,
    pub tenant: usize,
    pub bytes: u32,
    pub kind: IoKind,
    pub offset: u64,
}

#[derive(Debug, Default, Clone)]
struct Device {
    queue: DeviceQueue,
    deficit: i64,
    in_flight_bytes: u64,
    in_flight_ios: u32,
    delivered: u64,
    rate: WindowedMax,
    latency: LargeIoMin,
    /// Min time at the device alone (submit to device completion).
    device_latency: WindowedMin,
    cost: CostModel,
    last_offset: u64,
}

#[derive(Debug, Clone)]
struct Tenant {
    name: String,
    weight: f64,
    queued: usize,
    /// Devices of this tenant with queued IOs, in round-robin order.
    active: VecDeque<usize>,
    usage_bytes: u64,
    /// IOs released by this pacer and not yet done.
    in_flight: u32,
    queued_bytes: u64,
    /// The last poll held it back for a tenant served on another reactor.
    held: bool,
}

impl Tenant {
    /// One IO of `bytes` left the tenant's queue (released or cancelled).
    fn unqueue(&mut self, bytes: u64) {
        debug_assert!(
            self.queued > 0 && self.queued_bytes >= bytes,
            "tenant {}: leaves its queue more than it joined",
            self.name
        );
        self.queued -= 1;
        self.queued_bytes -= bytes;
    }
}

/// A released IO still counted in flight.
#[derive(Debug, Clone, Copy)]
struct Flight {
    flow: u64,
    device: usize,
    tenant: usize,
    bytes: u64,
    released_at: Nanos,
    took_op: bool,
    /// What it counts against the shared window (see `link_share`).
    paced: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantStats {
    pub name: String,
    pub weight: f64,
    pub queued: usize,
    pub usage_bytes: u64,
    /// Share of all bytes released so far.
    pub share: f64,
    /// Virtual time behind the most advanced tenant, in cost units.
    pub vtime_lag: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PacerStats {
    pub mode: Mode,
    pub calls: u64,
    pub polls: u64,
    pub ios: u64,
    /// rate: the effective period in microseconds; auto: the time one buffer
    /// of credit takes at the window's rate.
    pub period_us: f64,
    /// auto: the delivery rate the window is sized for, bytes/s.
    pub rate_bps: f64,
    pub window_bytes: u64,
    pub queued: usize,
    pub queue_lengths: Vec<usize>,
    pub bytes_in_flight: u64,
    pub bytes_in_flight_avg: f64,
    pub bytes_in_flight_max: u64,
    pub min_latency_us: f64,
    /// The lowest device vrate (1.0: the cost model's rate, or no targets).
    pub vrate: f64,
    /// Each device's vrate.
    pub vrates: Vec<f64>,
    pub tenants: Vec<TenantStats>,
}

pub struct Pacer {
    cfg: PacingConfig,
    devices: Vec<Device>,
    tenants: Vec<Tenant>,
    flights: HashMap<u64, Flight>,
    /// Each connection's drain rate and window (`auto`).
    flows: Flows,
    /// IOs that bypass pacing, released at the next poll.
    bypassed: Vec<PacedIo>,
    skipped: Vec<bool>,
    bytes_in_flight: u64,
    /// Bytes in flight counted at each device's link share: what the shared
    /// window bounds.
    paced_in_flight: u64,
    in_flight_avg: crate::stats::TimeAvg,
    // rate mode
    period_ns: f64,
    credit_bytes: f64,
    credit: f64,
    last_credit: Nanos,
    device_ops: Option<Arc<DeviceOps>>,
    tuner_last: Nanos,
    completions_since_tune: u64,
    // auto mode
    rate: WindowedMax,
    latency: LargeIoMin,
    window: u64,
    /// The window in effect for this poll: `window`, or this reactor's part
    /// of every reactor's (see [`LinkWindow`]).
    window_now: u64,
    /// All reactors' windows, and this reactor's index in them.
    link: Option<(Arc<LinkWindow>, usize)>,
    /// The largest IO seen (at least one buffer): DRR's quantum, and what
    /// counts as a large IO for the latency estimate.
    max_io: u64,
    released_total: u64,
    /// Tenants' virtual time: this pacer's own, or shared by all reactors.
    clock: Arc<TenantClock>,
    /// The last poll held a tenant back for one served on another reactor.
    held: bool,
    /// Devices' latency targets and budgets, shared by all reactors.
    qos: Option<Arc<DeviceQos>>,
    /// The last poll left IO waiting for device budget until then.
    qos_wake: Option<Nanos>,
    calls: u64,
    polls: u64,
    ios: u64,
}

/// What `poll` does with a tenant's turn (see [`Pacer::admit`]).
#[derive(Debug, Clone, Copy)]
enum Verdict {
    /// The IO goes now.
    Release(Grant),
    /// The turn's device cannot go now but another of the tenant's may:
    /// the tenant's next device takes the turn.
    NextDevice,
    /// Nothing more of this tenant goes in this poll.
    Skip,
    /// The tenant waits for the shared window or its flows' links: nothing
    /// more of it goes in this poll, and tenants ahead of it in virtual
    /// time wait with it.
    WaitForLink,
    /// The tenant runs too far ahead of one busy on another reactor and
    /// waits for it (rechecked soon, see `next_wakeup`).
    HoldForPeers,
}

/// An IO `admit` lets go, with what its release charges.
#[derive(Debug, Clone, Copy)]
struct Grant {
    /// The device whose DRR turn it is.
    front: usize,
    /// The device that serves the turn (see `turn_server`).
    device: usize,
    slot: Slot,
    io: PacedIo,
    /// The device's hold ratio (see `link_ratio`).
    ratio: f64,
    /// What it counts against the shared window (see `link_share`).
    paced: u64,
    took_op: bool,
}

/// Rate samples are taken over this span of completions.
const RATE_SAMPLE_NS: Nanos = 1_000_000;
/// Windowed max of the rate over this many samples (tracks link changes in ~50 ms).
const RATE_WINDOW: usize = 50;
/// A rate sample spans at least this many of the largest IOs.
const RATE_SAMPLE_IOS: u64 = 16;
/// Every this many rate samples, one is taken with the window enlarged...
const PROBE_EVERY: u64 = 8;
/// ...by this factor.
const PROBE_GAIN: f64 = 1.25;
/// How far (cost units per unit of weight, i.e. ns of device time) a tenant
/// may run ahead of a busy tenant served on another reactor before it waits.
const TENANT_SLACK: f64 = 1_000_000.0;
/// A tenant held to its share waits here while another reactor holds an
/// IO of it older by more than this (see `TenantClock::holds_oldest`).
const TENANT_FIFO_TOLERANCE_NS: Nanos = 1_000_000;
/// How soon a pacer holding a tenant back looks again.
const HOLD_RECHECK_NS: Nanos = 20_000;
/// Past this wait in the pacer, a device's DRR debt is forgiven, so a slow
/// device's share bounds its IOs' waits instead of starving them.
const MAX_PACER_WAIT_NS: Nanos = 100_000_000;
/// Devices holding buffers under this many times the fastest's time share
/// DRR turns oldest IO first (see `turn_server`).
const FAST_HOLD_RATIO: f64 = 2.0;
/// Min-latency window: how long an old minimum is trusted.
const LATENCY_WINDOW_NS: Nanos = 200_000_000;
/// How often `auto` drains its window to re-measure the unqueued latency:
/// twice per min-latency window, so every window holds a drained sample.
const LATENCY_PROBE_EVERY_NS: Nanos = LATENCY_WINDOW_NS / 2;
/// The drain lasts this many min latencies (the queue empties, then IOs
/// released into the empty pipeline complete), within these bounds.
const LATENCY_PROBE_LATENCIES: u64 = 4;
const LATENCY_PROBE_MIN_NS: Nanos = 50_000;
const LATENCY_PROBE_MAX_NS: Nanos = 2_000_000;

/// The delivered-rate estimator for a reactor or a device: the max of recent
/// samples of at least `RATE_SAMPLE_IOS` IOs, over the last
/// `RATE_WINDOW` sample spans.
fn rate_filter(max_io: u64) -> WindowedMax {
    WindowedMax::new(RATE_WINDOW)
        .with_min_bytes(RATE_SAMPLE_IOS * max_io)
        .with_max_age(RATE_WINDOW as Nanos * RATE_SAMPLE_NS)
}

impl Pacer {
    /// `devices` is the number of device queues; tenants come from the config
    /// (tenant 0 is the default for IO matching no tenant). `buffer_size` sets
    /// the default credit. `device_ops` is the shared op limit, if configured.
    pub fn new(
        cfg: PacingConfig,
        devices: usize,
        buffer_size: u32,
        device_ops: Option<Arc<DeviceOps>>,
        now: Nanos,
    ) -> Pacer {
        let mut tenants: Vec<Tenant> = cfg
            .tenants
            .iter()
            .map(|t| Tenant {
                name: t.name.clone(),
                weight: t.weight,
                queued: 0,
                active: VecDeque::new(),
                usage_bytes: 0,
                in_flight: 0,
                queued_bytes: 0,
                held: false,
            })
            .collect();
        if tenants.is_empty() {
            tenants.push(Tenant {
                name: "default".into(),
                weight: 1.0,
                queued: 0,
                active: VecDeque::new(),
                usage_bytes: 0,
                in_flight: 0,
                queued_bytes: 0,
                held: false,
            });
        }
        let clock = TenantClock::new(tenants.len());
        let period_ns = cfg.period_ns();
        let credit_bytes = cfg.credit.unwrap_or(u64::from(buffer_size)) as f64;
        let max_io = u64::from(buffer_size).max(4096);
        Pacer {
            devices: vec![
                Device {
                    rate: rate_filter(max_io),
                    latency: LargeIoMin::new(LATENCY_WINDOW_NS),
                    device_latency: WindowedMin::new(LATENCY_WINDOW_NS),
                    ..Device::default()
                };
                devices.max(1)
            ],
            tenants,
            flights: HashMap::new(),
            flows: Flows::default(),
            bypassed: Vec::new(),
            skipped: Vec::new(),
            bytes_in_flight: 0,
            paced_in_flight: 0,
            in_flight_avg: crate::stats::TimeAvg::new(now),
            period_ns,
            credit_bytes,
            credit: credit_bytes,
            last_credit: now,
            device_ops,
            tuner_last: now,
            completions_since_tune: 0,
            rate: rate_filter(max_io),
            latency: LargeIoMin::new(LATENCY_WINDOW_NS),
            window: 4 * max_io,
            window_now: 4 * max_io,
            link: None,
            max_io,
            released_total: 0,
            clock,
            held: false,
            qos: None,
            qos_wake: None,
            calls: 0,
            polls: 0,
            ios: 0,
            cfg,
        }
    }

    pub fn config(&self) -> &PacingConfig {
        &self.cfg
    }

    /// Changes mode and parameters at run time; queued IOs stay queued.
    pub fn reconfigure(&mut self, cfg: PacingConfig, now: Nanos) {
        self.period_ns = cfg.period_ns();
        if let Some(c) = cfg.credit {
            self.credit_bytes = c as f64;
        }
        self.credit = self.credit_bytes;
        self.last_credit = now;
        for (t, tc) in self.tenants.iter_mut().zip(&cfg.tenants) {
            t.weight = tc.weight;
        }
        self.cfg = cfg;
    }

    /// Shares tenants' virtual time with the other reactors' pacers (one
    /// clock for all of them, with this pacer's tenant count).
    pub fn share_tenants(&mut self, clock: Arc<TenantClock>) {
        if clock.tenants() == self.tenants.len() {
            self.clock = clock;
        }
    }

    /// Pools this pacer's window with the other reactors' (one
    /// [`LinkWindow`] for all of them; `reactor` is this one's index).
    pub fn share_link(&mut self, link: Arc<LinkWindow>, reactor: usize) {
        // One reactor has nothing to pool with: no shared writes per IO.
        if reactor < link.reactors() && link.reactors() > 1 {
            self.link = Some((link, reactor));
            self.publish_link();
        }
    }

    /// Publishes this reactor's window and the bytes it could release: a
    /// tenant held back for another reactor's does not claim link.
    fn publish_link(&self) {
        if let Some((link, r)) = &self.link {
            let backlog = self
                .tenants
                .iter()
                .filter(|t| !t.held)
                .map(|t| t.queued_bytes)
                .sum();
            link.publish(*r, self.window, backlog, self.paced_in_flight);
        }
    }

    /// Gives this pacer the devices' latency targets (one [`DeviceQos`]
    /// for all reactors).
    pub fn share_qos(&mut self, qos: Arc<DeviceQos>) {
        self.qos = Some(qos);
    }

    pub fn set_cost_model(&mut self, device: usize, model: CostModel) {
        if let Some(d) = self.devices.get_mut(device) {
            d.cost = model;
        }
    }

    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }

    pub fn queued(&self) -> usize {
        self.tenants.iter().map(|t| t.queued).sum::<usize>() + self.bypassed.len()
    }

    /// IO `id` was released and is not yet done.
    pub fn in_flight(&self, id: u64) -> bool {
        self.flights.contains_key(&id)
    }

    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    fn bypass(&self, io: &PacedIo) -> bool {
        match self.cfg.mode {
            Mode::None | Mode::Buffers => true,
            Mode::Rate => self.cfg.threshold.is_some_and(|t| io.bytes < t),
            Mode::Auto => false,
        }
    }

    /// Queues an IO. In pass-through modes it is released by the next poll.
    pub fn enqueue(&mut self, io: PacedIo, now: Nanos) {
        self.calls += 1;
        let t = io.tenant.min(self.tenants.len() - 1);
        let d = io.device.min(self.devices.len() - 1);
        let io = PacedIo {
            tenant: t,
            device: d,
            ..io
        };
        debug_assert!(
            !self.flights.contains_key(&io.id),
            "IO {} queued while in flight",
            io.id
        );
        self.max_io = self.max_io.max(u64::from(io.bytes));
        self.flows.queued(io.flow, self.max_io);
        if self.bypass(&io) {
            self.bypassed.push(io);
            return;
        }
        self.clock.queued(t);
        self.tenants[t].queued_bytes += u64::from(io.bytes);
        self.publish_link();
        let tenant = &mut self.tenants[t];
        tenant.queued += 1;
        if self.devices[d].queue.len() == 0 || !tenant.active.contains(&d) {
            tenant.active.push_back(d);
        }
        self.devices[d].queue.push(io, now);
    }

    /// Forgets flow `flow`'s state (its connection closed). Its IOs were
    /// cancelled before.
    pub fn close_flow(&mut self, flow: u64) {
        self.flows.close(flow);
    }

    /// Removes a queued IO (its connection died). False if not queued here.
    pub fn cancel(&mut self, id: u64) -> bool {
        for (di, d) in self.devices.iter_mut().enumerate() {
            if let Some(io) = d.queue.remove(id) {
                self.clock.dequeued(io.tenant);
                self.flows.unqueued(io.flow);
                let t = &mut self.tenants[io.tenant];
                t.unqueue(u64::from(io.bytes));
                if !d.queue.has(io.tenant) {
                    t.active.retain(|&x| x != di);
                }
                self.publish_link();
                // A reactor whose last connection died may poll no more.
                self.publish_oldest();
                return true;
            }
        }
        if let Some(pos) = self.bypassed.iter().position(|io| io.id == id) {
            let io = self.bypassed.swap_remove(pos);
            self.flows.unqueued(io.flow);
            return true;
        }
        if let Some(f) = self.flights.remove(&id) {
            self.land(f);
            // This reactor may poll no more (its last connection died): the
            // others must not go on counting what it held.
            self.publish_link();
            return true;
        }
        false
    }

    fn refill_credit(&mut self, now: Nanos) {
        debug_assert!(now >= self.last_credit, "the clock went back");
        let elapsed = (now - self.last_credit) as f64;
        self.last_credit = now;
        let per_ns = self.credit_bytes / self.period_ns.max(1.0);
        let cap = self.credit_bytes * self.cfg.burst;
        self.credit = (self.credit + elapsed * per_ns).min(cap);
    }

    /// The shared window has room for one more IO of `bytes` to device `d`.
    /// `paced` is its link share (see `link_share`).
    fn shared_window_open(&self, t: usize, paced: u64, bytes: u64) -> bool {
        self.paced_in_flight == 0
            || self.light(t)
            || (self.paced_in_flight + paced <= self.window_now
                && self.bytes_in_flight + bytes <= self.cfg.max_window)
    }

    /// Device `d`'s own window has room for one more IO of `bytes`.
    fn device_window_open(&self, d: usize, t: usize, bytes: u64) -> bool {
        let dev = &self.devices[d];
        dev.in_flight_bytes == 0
            || self.light(t)
            || dev.in_flight_bytes + bytes <= self.device_window(d)
    }

    /// Tenant `t` has one IO here and nothing in flight (a QD 1 client): it
    /// goes past full windows and device budgets, so a light tenant's IO never waits for a heavy
    /// tenant's to complete. This adds at most one IO per light tenant.
    fn light(&self, t: usize) -> bool {
        let tenant = &self.tenants[t];
        tenant.in_flight == 0 && tenant.queued <= 1 && self.tenants.len() > 1
    }

    fn device_window(&self, d: usize) -> u64 {
        let dev = &self.devices[d];
        match (dev.rate.get(), self.hold_time(d)) {
            (Some(r), Some(l)) => {
                let w = (self.cfg.gain * r * l as f64 / 1e9) as u64;
                self.clamp_window(w, 2)
            }
            // Until it has delivered, a device may fill the whole window.
            _ => self.window_now,
        }
    }

    /// `auto` is in a latency probe: the window drains for a moment so the
    /// min-latency estimate sees an empty pipeline. Without it, a window of
    /// gain x rate x latency keeps a standing queue, each min-latency epoch
    /// measures that queue, and the window it sizes grows with it. Every
    /// reactor reads the same clock, so they drain together and the queue
    /// they share empties.
    fn probing_latency(&self, now: Nanos) -> bool {
        self.probe_end(now).is_some()
    }

    /// When the latency probe under way ends (None: none is under way, or
    /// `auto` has no latency to size one with yet).
    fn probe_end(&self, now: Nanos) -> Option<Nanos> {
        if self.cfg.mode != Mode::Auto {
            return None;
        }
        let lat = self.latency.get()?;
        let len = (LATENCY_PROBE_LATENCIES * lat).clamp(LATENCY_PROBE_MIN_NS, LATENCY_PROBE_MAX_NS);
        let end = now - now % LATENCY_PROBE_EVERY_NS + len;
        (now < end).then_some(end)
    }

    /// A window of at least `min_ios` of the largest IO and at most
    /// `max_window` (unless that is smaller than the minimum).
    fn clamp_window(&self, w: u64, min_ios: u64) -> u64 {
        let min = min_ios * self.max_io;
        w.clamp(min, self.cfg.max_window.max(min))
    }

    /// Releases what may go now into `out` (IO ids).
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<u64>) {
        self.polls += 1;
        self.held = false;
        self.qos_wake = None;
        if self.queued() == 0 {
            return;
        }
        if self.cfg.mode == Mode::Rate {
            self.refill_credit(now);
            self.tune(now);
        }
        self.set_window_now(now);
        self.release_bypassed(now, out);
        // Tenants that cannot release anything more in this poll (a reused
        // scratch vector: poll runs on every request).
        let mut skipped = std::mem::take(&mut self.skipped);
        skipped.clear();
        skipped.resize(self.tenants.len(), false);
        for tenant in &mut self.tenants {
            tenant.held = false;
        }
        // The least virtual time of a tenant that waits for the shared
        // window: tenants further ahead than the slack wait with it.
        let mut link_waiter: Option<f64> = None;
        while let Some(t) = self.pick_tenant(&skipped) {
            match self.admit(t, link_waiter, now) {
                Verdict::Release(grant) => {
                    self.release(t, grant, now);
                    out.push(grant.io.id);
                }
                Verdict::NextDevice => self.tenants[t].active.rotate_left(1),
                Verdict::Skip => skipped[t] = true,
                Verdict::WaitForLink => {
                    skipped[t] = true;
                    let v = self.clock.vtime(t);
                    link_waiter = Some(link_waiter.map_or(v, |w| w.min(v)));
                }
                Verdict::HoldForPeers => {
                    skipped[t] = true;
                    self.held = true;
                    self.tenants[t].held = true;
                }
            }
        }
        self.skipped = skipped;
        self.publish_link();
        self.publish_oldest();
    }

    /// The window in effect for this poll: this reactor's own or its part of
    /// the pooled one, and only half the path's rate x latency during a
    /// latency probe (the standing queue that gain builds drains, and the
    /// IOs released now see the bare latency).
    fn set_window_now(&mut self, now: Nanos) {
        self.resize_window();
        self.window_now = self
            .link
            .as_ref()
            .and_then(|(l, r)| l.share(*r))
            .map_or(self.window, |w| self.clamp_window(w, 2));
        if self.probing_latency(now) {
            let half_bdp = self.window_now as f64 / (2.0 * self.cfg.gain.max(1.0));
            self.window_now = (half_bdp as u64).max(self.max_io);
        }
    }

    /// IOs that bypass pacing go at once.
    fn release_bypassed(&mut self, now: Nanos, out: &mut Vec<u64>) {
        for io in std::mem::take(&mut self.bypassed) {
            self.tenants[io.tenant].usage_bytes += u64::from(io.bytes);
            self.take_flight(io, false, u64::from(io.bytes), now);
            out.push(io.id);
        }
    }

    /// The verdict on tenant `t`'s turn: which IO goes, or why none does.
    /// `link_waiter` is the least virtual time of a tenant waiting for the
    /// shared window in this poll.
    fn admit(&mut self, t: usize, link_waiter: Option<f64>, now: Nanos) -> Verdict {
        if let Some(v) = self.tenant_gate(t, link_waiter) {
            return v;
        }
        // The device whose DRR turn it is (`front`), and the one that
        // serves it (`d`: the same, or the fast device with the oldest IO).
        let Some(front) = self.front_device(t) else {
            return Verdict::Skip;
        };
        let Some((d, slot)) = self.turn_server(t, front, now) else {
            // Every flow with IO at this turn's device (and, for a fast
            // device, at every fast device: see `turn_server`) waits for
            // its window. A slow device's turn goes to the next device,
            // if one may go. Otherwise the tenant waits for its flows'
            // links, and like one waiting for the shared window holds back
            // tenants ahead of it: a link it shares with them is theirs to
            // take only by weight, and its slow devices take no more than
            // their DRR turns.
            if self.link_ratio(front) < FAST_HOLD_RATIO {
                return Verdict::WaitForLink;
            }
            return self.next_device_or(t, front, Verdict::WaitForLink, |p| {
                p.all_windows_closed(t, now)
            });
        };
        let io = self.devices[d].queue.io(slot);
        let bytes = u64::from(io.bytes);
        // One hold ratio per release: the shared window, the charge and
        // the flight all use it.
        let ratio = self.link_ratio(d);
        let paced = (bytes as f64 / ratio).ceil() as u64;
        if let Some(v) = self.mode_gate(t, d, &io, paced, now) {
            return v;
        }
        if !self.light(t) && !self.qos_ready(d, now) {
            // This device waits for budget (its latency target); the
            // tenant's other devices need not. A light tenant's IO is
            // within its share, as iocost's per-cgroup budgets have it:
            // it is charged but does not wait.
            return self.next_device_or(t, d, Verdict::Skip, |p| p.all_windows_closed(t, now));
        }
        let took_op = match self.take_device_op(d) {
            Some(true) => true,
            Some(false) => {
                return self.next_device_or(t, d, Verdict::Skip, |p| p.all_ops_exhausted(t))
            }
            None => false,
        };
        if self.cfg.mode == Mode::Auto && !self.drr_turn(t, front, now) {
            return Verdict::NextDevice;
        }
        Verdict::Release(Grant {
            front,
            device: d,
            slot,
            io,
            ratio,
            paced,
            took_op,
        })
    }

    /// Whether tenant `t` waits for other tenants before its devices are
    /// looked at (None: it need not).
    fn tenant_gate(&self, t: usize, link_waiter: Option<f64>) -> Option<Verdict> {
        // The shared window is the link's, and a tenant waiting for it
        // waits for the link; one that took the gap instead would take
        // the link from it, whatever the weights. (A slow device's IO
        // counts a fraction of its bytes in the window, so a tenant of
        // slow devices always finds a gap.)
        if let Some(v) = link_waiter.filter(|_| !self.light(t)) {
            let ahead = self.clock.vtime(t) > v + TENANT_SLACK;
            // Held to its share, the tenant's slots go to the reactor
            // with its oldest IO, not to whichever polls first.
            let elsewhere = self
                .link
                .as_ref()
                .is_some_and(|(_, r)| !self.clock.holds_oldest(t, *r, TENANT_FIFO_TOLERANCE_NS));
            if ahead || elsewhere {
                return Some(Verdict::Skip);
            }
        }
        // Tenants queued here are arbitrated here; one busy only on other
        // reactors is waited for if this one runs too far ahead of it.
        if self.clock.lead(t, |u| self.tenants[u].queued > 0) > TENANT_SLACK {
            return Some(Verdict::HoldForPeers);
        }
        None
    }

    /// The device whose DRR turn it is for tenant `t`; devices left with
    /// no IO of `t` leave the rotation first.
    fn front_device(&mut self, t: usize) -> Option<usize> {
        loop {
            let front = self.tenants[t].active.front().copied()?;
            if self.devices[front].queue.has(t) {
                return Some(front);
            }
            self.tenants[t].active.pop_front();
        }
    }

    /// The mode's own limit on releasing `io` to device `d` (None: it
    /// allows it). `paced` is the IO's link share (see `link_share`).
    fn mode_gate(
        &mut self,
        t: usize,
        d: usize,
        io: &PacedIo,
        paced: u64,
        now: Nanos,
    ) -> Option<Verdict> {
        let bytes = u64::from(io.bytes);
        match self.cfg.mode {
            Mode::None | Mode::Buffers => None,
            Mode::Rate => (!(self.bypass(io) || self.credit > 0.0)).then_some(Verdict::Skip),
            // The shared window waits for the device whose turn it is: a
            // smaller-charged IO behind it must not take the gap, or DRR's
            // shares would not hold.
            Mode::Auto if !self.shared_window_open(t, paced, bytes) => Some(Verdict::WaitForLink),
            Mode::Auto if self.device_window_open(d, t, bytes) => None,
            // This device's window is full; the turn goes to the next one.
            Mode::Auto => {
                Some(self.next_device_or(t, d, Verdict::Skip, |p| p.all_windows_closed(t, now)))
            }
        }
    }

    /// Device `d` cannot take tenant `t`'s IO now: its turn goes to the
    /// tenant's next device if another has IO and `others_blocked` says one
    /// of them may go; otherwise `otherwise`.
    fn next_device_or(
        &mut self,
        t: usize,
        d: usize,
        otherwise: Verdict,
        others_blocked: impl FnOnce(&mut Self) -> bool,
    ) -> Verdict {
        if self.tenant_has_other_device(t, d) && !others_blocked(self) {
            Verdict::NextDevice
        } else {
            otherwise
        }
    }

    /// `rate` with a device op limit: takes one of device `d`'s op slots
    /// (Some(false): none is free). None: no limit applies.
    fn take_device_op(&self, d: usize) -> Option<bool> {
        if self.cfg.mode != Mode::Rate {
            return None;
        }
        self.device_ops.as_ref().map(|ops| ops.try_take(d))
    }

    /// `auto`'s deficit round robin: a new turn for device `front` adds one
    /// quantum. False: the device, still in debt from an expensive IO, gives
    /// the turn to the tenant's next device. Unless its oldest IO has waited
    /// too long: the debt is a share, not a stall.
    fn drr_turn(&mut self, t: usize, front: usize, now: Nanos) -> bool {
        let quantum = self.max_io as i64;
        let dev = &mut self.devices[front];
        if dev.deficit > 0 {
            return true;
        }
        if dev.queue.oldest().is_some_and(|t0| {
            debug_assert!(now >= t0, "IO queued in the future");
            now - t0 > MAX_PACER_WAIT_NS
        }) {
            dev.deficit = dev.deficit.max(0);
        }
        dev.deficit += quantum;
        if self.devices[front].deficit <= 0 && self.tenant_has_other_device(t, front) {
            return false;
        }
        let dev = &mut self.devices[front];
        while dev.deficit <= 0 {
            dev.deficit += quantum;
        }
        true
    }

    /// Releases the IO `admit` granted tenant `t`: out of its queue, charged
    /// to the tenant's virtual time, the device's DRR turn and its budget,
    /// and counted in flight.
    fn release(&mut self, t: usize, g: Grant, now: Nanos) {
        let (d, front, io) = (g.device, g.front, g.io);
        let bytes = u64::from(io.bytes);
        let quantum = self.max_io as i64;
        // A device's bytes are charged by how long they hold buffers, so
        // when the link is short each device's share falls as 1/latency,
        // what Little's law gives devices at equal queue depth: a slow
        // device neither starves nor crowds fast ones off the link.
        let charge = (bytes as f64 * g.ratio) as i64;
        // Deficit round robin by cost between this tenant's devices.
        let cost =
            self.devices[d]
                .cost
                .cost(io.kind, io.bytes, io.offset == self.devices[d].last_offset);
        if let Some(q) = &self.qos {
            q.charge(d, cost, now);
        }
        let dev = &mut self.devices[d];
        dev.queue.take(g.slot);
        dev.last_offset = io.offset + bytes;
        if d != front && !dev.queue.has(t) {
            self.tenants[t].active.retain(|&x| x != d);
        }
        let dev = &mut self.devices[front];
        dev.deficit -= charge;
        let tenant = &mut self.tenants[t];
        self.clock.advance(t, cost / tenant.weight);
        self.clock.dequeued(t);
        tenant.usage_bytes += bytes;
        tenant.unqueue(bytes);
        if dev.deficit <= 0 || !dev.queue.has(t) {
            if self.cfg.mode != Mode::Auto {
                dev.deficit += quantum;
            }
            let still = dev.queue.has(t);
            tenant.active.pop_front();
            if still {
                tenant.active.push_back(front);
            }
        }
        if self.cfg.mode == Mode::Rate {
            self.credit -= bytes as f64;
        }
        self.take_flight(io, g.took_op, g.paced, now);
    }

    /// Publishes when each tenant's oldest IO queued here arrived, for the
    /// reactors' shared tenant clock. Only with tenants on pooled reactors.
    fn publish_oldest(&self) {
        let Some((_, r)) = &self.link else { return };
        if self.tenants.len() < 2 || self.clock.reactors() < 2 {
            return;
        }
        for (t, tenant) in self.tenants.iter().enumerate() {
            let oldest = tenant
                .active
                .iter()
                .filter_map(|&d| {
                    let q = &self.devices[d].queue;
                    q.head(t, |_| true).map(|s| q.arrived(s))
                })
                .min();
            self.clock.set_oldest(t, *r, oldest);
        }
    }

    /// Counts a released IO as in flight until `on_complete` or `cancel`.
    fn take_flight(&mut self, io: PacedIo, took_op: bool, paced: u64, now: Nanos) {
        let bytes = u64::from(io.bytes);
        let dev = &mut self.devices[io.device];
        dev.in_flight_bytes += bytes;
        dev.in_flight_ios += 1;
        self.tenants[io.tenant].in_flight += 1;
        self.flows.released(io.flow, bytes);
        self.bytes_in_flight += bytes;
        self.paced_in_flight += paced;
        self.in_flight_avg.update(now, self.bytes_in_flight);
        self.released_total += bytes;
        let earlier = self.flights.insert(
            io.id,
            Flight {
                flow: io.flow,
                device: io.device,
                tenant: io.tenant,
                bytes,
                released_at: now,
                took_op,
                paced,
            },
        );
        debug_assert!(earlier.is_none(), "IO {} released twice", io.id);
        self.ios += 1;
    }

    /// The shared window is sized as the link's rate x the fastest device's
    /// latency, so it bounds the *rate* released: a device that holds its
    /// buffers k times longer delivers its bytes k times more slowly, and
    /// counts 1/k of them. (Its real bytes are bounded by `max_window` and
    /// its own window.)
    fn link_share(&self, d: usize, bytes: u64) -> u64 {
        (bytes as f64 / self.link_ratio(d)).ceil() as u64
    }

    /// The hold ratio in `auto`; 1 in the modes without windows.
    fn link_ratio(&self, d: usize) -> f64 {
        if self.cfg.mode == Mode::Auto {
            self.hold_ratio(d)
        } else {
            1.0
        }
    }

    /// How long device `d`'s IOs need their buffers: the min release-to-done
    /// time, but no more than its time at the device plus the fastest
    /// release-to-done (the send path). A flow whose replies always queue
    /// behind a slow wire never sees its unqueued latency; without the bound,
    /// its window would grow with the queue it makes.
    fn hold_time(&self, d: usize) -> Option<u64> {
        let dev = &self.devices[d];
        let measured = dev.latency.get()?;
        match (dev.device_latency.get(), self.latency.get()) {
            (Some(at_device), Some(fastest)) => Some(measured.min(at_device + fastest)),
            _ => Some(measured),
        }
    }

    /// How much longer than the fastest device this device holds its
    /// buffers (the reactor's min latency is the fastest device's).
    fn hold_ratio(&self, d: usize) -> f64 {
        match (self.hold_time(d), self.latency.get()) {
            (Some(l), Some(fastest)) => (l as f64 / fastest as f64).clamp(1.0, 1000.0),
            _ => 1.0,
        }
    }

    /// Which device serves tenant `t`'s turn at `front`, and the position of
    /// its IO there. In `auto`, a fast device's turn goes to the fast device
    /// (one holding buffers under twice the fastest's time) whose oldest IO
    /// of this tenant has waited longest and that may take it now: fast
    /// devices then drain as one FIFO queue. With turns kept per device,
    /// random arrivals leave some queues much deeper than others while each
    /// gets the same rate, and their IOs wait several times longer. Slow
    /// devices keep their own turns and charges.
    fn turn_server(&mut self, t: usize, front: usize, now: Nanos) -> Option<(usize, Slot)> {
        let front_slot = self.head(front, t);
        if self.cfg.mode != Mode::Auto || self.hold_ratio(front) >= FAST_HOLD_RATIO {
            return front_slot.map(|s| (front, s));
        }
        let mut best = (front_slot.map(|s| (front, s)), Nanos::MAX);
        // By index: `qos_ready` notes when a device waiting for budget may
        // go, as the front's own check would.
        for i in 0..self.tenants[t].active.len() {
            let d = self.tenants[t].active[i];
            let Some(slot) = self.head(d, t) else {
                continue;
            };
            let q = &self.devices[d].queue;
            let arrived = q.arrived(slot);
            if arrived >= best.1
                || self.hold_ratio(d) >= FAST_HOLD_RATIO
                || !self.device_window_open(d, t, u64::from(q.io(slot).bytes))
                || !self.qos_ready(d, now)
            {
                continue;
            }
            best = (Some((d, slot)), arrived);
        }
        best.0
    }

    /// Tenant `t`'s oldest IO at device `d` whose flow may take it now.
    fn head(&self, d: usize, t: usize) -> Option<Slot> {
        self.devices[d].queue.head(t, |io| self.flow_open(io))
    }

    /// The IO's flow has room in its window (in `auto`; a light tenant's IO
    /// goes past full windows, see `light`).
    fn flow_open(&self, io: &PacedIo) -> bool {
        self.cfg.mode != Mode::Auto
            || self.light(io.tenant)
            || self.flows.open(io.flow, u64::from(io.bytes))
    }

    fn sizing(&self) -> Sizing {
        Sizing {
            gain: self.cfg.gain,
            max_io: self.max_io,
            max_window: self.cfg.max_window,
            latency: self.latency.get(),
        }
    }

    fn tenant_has_other_device(&self, t: usize, d: usize) -> bool {
        self.tenants[t].active.iter().any(|&x| x != d)
    }

    /// No device of tenant `t` can take its next IO now: its windows (in
    /// `auto`) are full or it waits for budget.
    fn all_windows_closed(&mut self, t: usize, now: Nanos) -> bool {
        // By index: `qos_ready` notes wakeups, and this runs on every poll
        // that finds a window full, so no copy of the list is made.
        for i in 0..self.tenants[t].active.len() {
            let d = self.tenants[t].active[i];
            let Some(slot) = self.head(d, t) else {
                continue;
            };
            let bytes = u64::from(self.devices[d].queue.io(slot).bytes);
            let windows = self.cfg.mode != Mode::Auto
                || (self.shared_window_open(t, self.link_share(d, bytes), bytes)
                    && self.device_window_open(d, t, bytes));
            if windows && self.qos_ready(d, now) {
                return false;
            }
        }
        true
    }

    /// Device `d` has budget under its latency target (always, without one);
    /// if not, the next poll is due when it will.
    fn qos_ready(&mut self, d: usize, now: Nanos) -> bool {
        let Some(q) = &self.qos else { return true };
        let at = q.ready_at(d, now);
        if at <= now {
            return true;
        }
        self.qos_wake = Some(self.qos_wake.map_or(at, |w| w.min(at)));
        false
    }

    fn all_ops_exhausted(&self, t: usize) -> bool {
        let Some(ops) = &self.device_ops else {
            return false;
        };
        self.tenants[t].active.iter().all(|&d| ops.exhausted(d))
    }

    /// The queued tenant with the least virtual time (weighted fair queuing).
    fn pick_tenant(&self, skipped: &[bool]) -> Option<usize> {
        self.tenants
            .iter()
            .enumerate()
            .filter(|(i, t)| t.queued > 0 && !t.active.is_empty() && !skipped[*i])
            .map(|(i, _)| i)
            .min_by(|&a, &b| self.clock.vtime(a).total_cmp(&self.clock.vtime(b)))
    }

    /// The device finished an IO after `latency_ns` at the device.
    pub fn on_device_complete(&mut self, device: usize, kind: IoKind, latency_ns: u64, now: Nanos) {
        if let Some(d) = self.devices.get_mut(device) {
            d.device_latency.update(latency_ns.max(1), now);
        }
        if let Some(q) = &self.qos {
            q.record(device, kind, latency_ns, now);
        }
    }

    /// The IO is done and its data has left (reply sent): its window frees,
    /// and its release-to-done time and bytes feed the estimators.
    pub fn on_complete(&mut self, id: u64, now: Nanos) {
        let flight = self.flights.remove(&id);
        debug_assert!(flight.is_some(), "IO {id} done but not in flight");
        let Some(f) = flight else { return };
        debug_assert!(now >= f.released_at, "IO done before its release");
        let latency = (now - f.released_at).max(1);
        let large = f.bytes >= self.max_io / 2;
        self.latency.update(latency, large, now);
        let dev = &mut self.devices[f.device];
        dev.latency.update(latency, large, now);
        dev.delivered += f.bytes;
        self.land(f);
        let sizing = self.sizing();
        self.flows.delivered(f.flow, f.bytes, now, sizing);
        self.resize_window();
        self.publish_link();
        self.completions_since_tune += 1;
        self.sample_rates(now);
        self.in_flight_avg.update(now, self.bytes_in_flight);
    }

    fn land(&mut self, f: Flight) {
        self.flows.landed(f.flow, f.bytes);
        let dev = &mut self.devices[f.device];
        debug_assert!(
            dev.in_flight_ios > 0 && dev.in_flight_bytes >= f.bytes,
            "device {}: lands more than it has in flight",
            f.device
        );
        dev.in_flight_bytes -= f.bytes;
        dev.in_flight_ios -= 1;
        let t = &mut self.tenants[f.tenant];
        debug_assert!(
            t.in_flight > 0,
            "tenant {}: lands more than it has in flight",
            t.name
        );
        t.in_flight -= 1;
        debug_assert!(
            self.bytes_in_flight >= f.bytes && self.paced_in_flight >= f.paced,
            "lands more than is in flight"
        );
        self.bytes_in_flight -= f.bytes;
        self.paced_in_flight -= f.paced;
        if f.took_op {
            if let Some(ops) = &self.device_ops {
                ops.give(f.device);
            }
        }
    }

    fn sample_rates(&mut self, now: Nanos) {
        for d in &mut self.devices {
            d.rate.offer(now, d.delivered, RATE_SAMPLE_NS);
        }
        let delivered: u64 = self.devices.iter().map(|d| d.delivered).sum();
        self.rate.offer(now, delivered, RATE_SAMPLE_NS);
    }

    /// `auto`'s window: the sum of its active flows' windows (see
    /// [`flows`]), at least four of the largest IO.
    fn resize_window(&mut self) {
        if self.cfg.mode != Mode::Auto {
            return;
        }
        let w = self.clamp_window(self.flows.window_sum(), 4);
        if w != self.window {
            self.window = w;
            self.publish_link();
        }
    }

    /// rate mode tuners, once per period's worth of completions.
    fn tune(&mut self, now: Nanos) {
        let Some(tuner) = self.cfg.tuner else { return };
        let base = self.cfg.period_ns();
        debug_assert!(now >= self.tuner_last, "the clock went back");
        let elapsed = now - self.tuner_last;
        if elapsed < 1_000_000 {
            return;
        }
        match tuner {
            Tuner::IoRate => {
                // The seed's rule: measured IO period minus 1 us, bounded [P, 2P].
                if self.completions_since_tune > 0 {
                    let measured = elapsed as f64 / self.completions_since_tune as f64;
                    self.period_ns = (measured - 1000.0).clamp(base, 2.0 * base);
                }
            }
            Tuner::BytesInFlight => {
                // Lengthen the period while bytes in flight exceed the target.
                let target = self.cfg.target_in_flight.unwrap_or(4 << 20);
                let step = 1000.0;
                self.period_ns = if self.bytes_in_flight > target {
                    (self.period_ns + step).min(2.0 * base)
                } else {
                    (self.period_ns - step).max(base)
                };
            }
        }
        self.tuner_last = now;
        self.completions_since_tune = 0;
    }

    /// When the next poll could release something without a completion
    /// arriving first (rate mode's next credit, a device's budget, a held
    /// tenant's recheck), if anything is queued.
    pub fn next_wakeup(&self, now: Nanos) -> Option<Nanos> {
        if self.queued() == 0 {
            return None;
        }
        let mut wake = self.qos_wake;
        let mut at = |t: Nanos| wake = Some(wake.map_or(t, |w| w.min(t)));
        if self.held {
            // Nothing here completes when another reactor's tenant catches up.
            at(now + HOLD_RECHECK_NS);
        }
        if let Some(end) = self.probe_end(now) {
            // The window reopens when the latency probe ends.
            at(end);
        }
        if self.cfg.mode == Mode::Rate {
            if self.credit > 0.0 {
                // Credit is there; unless a device's budget is what holds
                // the queue (then its time is already in `wake`), poll now.
                if self.qos_wake.is_none() {
                    at(now);
                }
            } else {
                let per_ns = self.credit_bytes / self.period_ns.max(1.0);
                let wait = ((-self.credit + 1.0) / per_ns.max(1e-12)).ceil() as u64;
                at(now + wait.max(1_000));
            }
        }
        wake
    }

    pub fn stats(&self, now: Nanos) -> PacerStats {
        let vtimes: Vec<f64> = (0..self.tenants.len())
            .map(|t| self.clock.vtime(t))
            .collect();
        let max_v = vtimes.iter().copied().fold(0.0, f64::max);
        let vrates: Vec<f64> = (0..self.devices.len())
            .map(|d| self.qos.as_ref().map_or(1.0, |q| q.vrate(d)))
            .collect();
        let total = self.released_total.max(1) as f64;
        let rate = self.rate.get().unwrap_or(0.0);
        let period_us = match self.cfg.mode {
            Mode::Rate => self.period_ns / 1000.0,
            Mode::Auto if rate > 0.0 => self.max_io as f64 / rate * 1e6,
            _ => 0.0,
        };
        PacerStats {
            mode: self.cfg.mode,
            calls: self.calls,
            polls: self.polls,
            ios: self.ios,
            period_us,
            rate_bps: rate,
            window_bytes: if self.cfg.mode == Mode::Auto {
                self.window
            } else {
                0
            },
            queued: self.queued(),
            queue_lengths: self.devices.iter().map(|d| d.queue.len()).collect(),
            bytes_in_flight: self.bytes_in_flight,
            bytes_in_flight_avg: self.in_flight_avg.avg(now),
            bytes_in_flight_max: self.in_flight_avg.max(),
            min_latency_us: self.latency.get().map_or(0.0, |l| l as f64 / 1e3),
            vrate: vrates.iter().copied().fold(1.0, f64::min),
            vrates,
            tenants: self
                .tenants
                .iter()
                .zip(&vtimes)
                .map(|(t, v)| TenantStats {
                    name: t.name.clone(),
                    weight: t.weight,
                    queued: t.queued,
                    usage_bytes: t.usage_bytes,
                    share: t.usage_bytes as f64 / total,
                    vtime_lag: max_v - v,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod tests;
