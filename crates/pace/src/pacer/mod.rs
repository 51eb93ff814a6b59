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
//!   the buffer pool's limit alone).
//! - `rate`: a byte credit every `period`, round robin
//!   over device queues, optional size threshold, per-device op credit, and
//!   the `io-rate` / `bytes-in-flight` period tuners. Credit from late polls
//!   is kept up to `burst` periods; queued IOs always leave eventually.
//! - `auto`: no period. Bytes in flight are held near what the pipeline
//!   needs: `gain x (max delivered rate) x (min release-to-done latency)`,
//!   measured from completions (the wire's drain), with one window per device
//!   so a slow device cannot take the buffers fast ones need. A device's
//!   window counts device time by its cost model, not bytes, so small IOs
//!   cannot crowd a busy device beyond what its window means.
//!   Every 100 ms the window drains briefly, so the min latency is measured
//!   on an empty pipeline and not on the queue the window itself keeps.
//!
//! In `rate` and `auto`, devices with latency targets (see [`qos`]) also
//! wait for device-time budget at their current vrate.
//!
//! In every mode, tenants share each release opportunity by weighted fair
//! queuing on virtual time over IO cost, and devices within a tenant by
//! deficit round robin.
//!
//! Where each part is: the pacer is a composition of components that own
//! their fields, each with its `impl` in one file, and each called with
//! the other parts it reads as arguments. `drr`'s `Scheduler` holds the
//! devices' queues and DRR turns, and `tenants`' `Tenants` the tenants and
//! their clock (WFQ: which goes next, which waits for peers);
//! `auto_window`'s `Windows` holds `auto`'s estimators, depth, latency
//! probe, reactor and link windows, ports and the connections' windows
//! (`flows`); `gates`' `Gates` the devices' budgets ([`qos`]), caps
//! ([`DeviceGate`]) and op limits; `rate` keeps `rate`'s credit and tuners.
//! `impl Pacer` is in two files: here, an IO's life (enqueue, poll,
//! completions, cancel), and `admit`, the gate order: the verdict on each
//! tenant's turn, which device serves it, and `release`. `queues` holds a
//! device's per-flow FIFOs; [`PacerGroup`] builds one target's pacers over
//! what they share, and `report` their [`PacerStats`].

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::Nanos;

/// `x.ceil() as u64` for every f64, without the call to libm's `ceil`
/// (the baseline x86-64 target has no rounding instruction, and this runs
/// several times per IO). Truncation is exact below 2^53, every f64 above
/// is whole, NaN and negatives give 0, and too large saturates, as `as`.
#[inline]
pub(crate) fn ceil_u64(x: f64) -> u64 {
    let t = x as u64;
    if (t as f64) < x {
        t.saturating_add(1)
    } else {
        t
    }
}

pub mod ablate;
mod admit;
mod auto_window;
mod census;
mod config;
mod depth;
mod device_gate;
mod device_ops;
mod device_share;
mod drain_probe;
mod drr;
mod fair;
mod filter;
mod flight;
mod flows;
mod gates;
mod group;
mod link_window;
mod pools;
mod ports;
mod qos;
mod queues;
mod rate;
mod report;
mod sizing;
mod tenant_clock;
mod tenant_part;
mod tenants;
mod units;

use admit::Verdict;
use auto_window::Windows;
pub use census::Held;
pub use config::{Mode, PacingConfig, TenantConfig, Tuner};
pub use depth::SharedDepth;
pub use device_gate::DeviceGate;
pub use device_ops::DeviceOps;
pub use device_share::DeviceShares;
use drr::{Device, Scheduler};
use flight::{DeviceStage, Flight};
use gates::Gates;
pub use group::{PacedDevice, PacerGroup};
pub use link_window::LinkWindow;
pub use ports::PortLoad;
pub use qos::{burst_ns as qos_burst_ns, DeviceQos, QosConfig};
use rate::RateCredit;
pub use report::{PacerStats, TenantStats};
pub use tenant_clock::TenantClock;
use tenants::HOLD_RECHECK_NS;
pub use types::{CostModel, IoKind};
pub use units::DeviceNs;

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
    /// The whole request's bytes: `bytes` unless it is a piece of a
    /// larger request, whose pieces come together.
    pub request: u32,
    pub kind: IoKind,
    pub offset: u64,
}

#[cfg(test)]
impl PacedIo {
    /// A 4 KiB read at device 0, whole (a test's).
    pub(crate) fn read_4k(id: u64, flow: u64, tenant: usize) -> PacedIo {
        PacedIo {
            id,
            flow,
            device: 0,
            tenant,
            bytes: 4096,
            request: 4096,
            kind: IoKind::Read,
            offset: 0,
        }
    }
}

pub struct Pacer {
    cfg: PacingConfig,
    /// Which tenant and device each release opportunity goes to.
    sched: Scheduler,
    /// `auto`'s windows, each connection's among them.
    windows: Windows,
    flights: FxHashMap<u64, Flight>,
    /// IOs that bypass pacing, released at the next poll.
    bypassed: Vec<PacedIo>,
    skipped: Vec<bool>,
    /// Per device, the least virtual time of a tenant whose IO its full
    /// window held back in this poll (see `admit::device_turn`).
    device_waiters: Vec<f64>,
    bytes_in_flight: u64,
    /// Released write pieces whose payload is still arriving.
    filling: usize,
    in_flight_avg: crate::stats::TimeAvg,
    /// `rate` mode's credit and period.
    rate_credit: RateCredit,
    released_total: u64,
    /// Devices' budgets, caps and op limits, shared by all reactors.
    gates: Gates,
    calls: u64,
    polls: u64,
    ios: u64,
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
        let max_io = u64::from(buffer_size).max(4096);
        Pacer {
            sched: Scheduler::new(&cfg.tenants, devices, max_io),
            windows: Windows::new(devices, max_io, now),
            flights: FxHashMap::default(),
            bypassed: Vec::new(),
            skipped: Vec::new(),
            device_waiters: Vec::new(),
            bytes_in_flight: 0,
            filling: 0,
            in_flight_avg: crate::stats::TimeAvg::new(now),
            rate_credit: RateCredit::new(&cfg, buffer_size, now),
            released_total: 0,
            gates: Gates::new(device_ops),
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
        self.rate_credit.reconfigure(&cfg, now);
        self.sched.tenants.reweight(&cfg.tenants);
        if cfg.mode != self.cfg.mode {
            self.windows.reset_depth();
        }
        self.cfg = cfg;
    }

    /// Shares tenants' virtual time with the other reactors' pacers (one
    /// clock for all of them, with this pacer's tenant count).
    pub fn share_tenants(&mut self, clock: Arc<TenantClock>) {
        self.sched.tenants.share_clock(clock);
    }

    /// Gives this pacer the devices' latency targets (one [`DeviceQos`]
    /// for all reactors).
    pub fn share_qos(&mut self, qos: Arc<DeviceQos>) {
        self.gates.share_qos(qos);
    }

    /// Shares the devices' caps with the other reactors' pacers: heavy
    /// IOs wait for them while a light tenant is about.
    pub fn share_gate(&mut self, gate: Arc<DeviceGate>) {
        self.gates.share_gate(gate);
    }

    pub fn set_cost_model(&mut self, device: usize, model: CostModel) {
        if let Some(d) = self.sched.devices.get_mut(device) {
            debug_assert!(
                d.queue.len() == 0 && d.in_flight_ios == 0,
                "a device's cost model is set before its IO"
            );
            // Its rate is in device time: samples span as much of it as
            // before the model came.
            *d = Device::new(model, self.windows.max_io);
        }
    }

    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }

    pub fn queued(&self) -> usize {
        self.sched.tenants.queued() + self.bypassed.len()
    }

    /// IO `id` was released and is not yet done.
    pub fn in_flight(&self, id: u64) -> bool {
        self.flights.contains_key(&id)
    }

    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    pub fn stats(&self, now: Nanos) -> PacerStats {
        PacerStats::of(self, now)
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
        let t = io.tenant.min(self.sched.tenants.len() - 1);
        let d = io.device.min(self.sched.devices.len() - 1);
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
        let w = &mut self.windows;
        w.flow_tenant(io.flow, t);
        w.max_io = w.max_io.max(u64::from(io.bytes));
        let lone = w
            .flows
            .queued(io.flow, (d, t), u64::from(io.bytes), w.max_io, now);
        if lone && self.cfg.mode == Mode::Auto {
            w.lone_io(d, now);
            self.sched.devices[d].held = true;
        }
        if self.bypass(&io) {
            self.bypassed.push(io);
            return;
        }
        self.sched.tenants[t].queued_bytes += u64::from(io.bytes);
        self.windows.publish_link(&self.sched.tenants);
        self.sched.tenants.queue(t);
        let tenant = &mut self.sched.tenants[t];
        if self.sched.devices[d].queue.len() == 0 || !tenant.active.contains(&d) {
            tenant.active.push_back(d);
        }
        let work = self.sched.devices[d].work(io.kind, u64::from(io.bytes));
        self.sched.devices[d].queue.push(io, now, work);
        self.windows.publish_hosts();
    }

    /// Flow `flow` (a connection) comes from `host` (an id of its peer's
    /// address): the host's connections share its link. A flow never opened
    /// is a host of its own.
    pub fn open_flow(&mut self, flow: u64, host: u64) {
        self.windows.flows.join(flow, host);
    }

    /// Forgets flow `flow`'s state (its connection closed). Its IOs were
    /// cancelled before.
    pub fn close_flow(&mut self, flow: u64) {
        self.windows.close_flow(flow);
    }

    /// Learns the depth with the other reactors' pacers (one
    /// [`SharedDepth`] for all of them).
    pub fn share_depth(&mut self, depth: Arc<SharedDepth>) {
        self.windows.share_depth(depth);
    }

    /// Splits each device's rate with the other reactors' pacers.
    pub fn share_devices(&mut self, shares: Arc<DeviceShares>) {
        self.windows.share_devices(shares);
    }

    /// Pools this pacer's window with the other reactors' (one
    /// [`LinkWindow`] for all of them; `reactor` is this one's index).
    pub fn share_link(&mut self, link: Arc<LinkWindow>, reactor: usize) {
        self.windows.share_link(link, reactor, &self.sched.tenants);
    }

    /// Measures the target's ports, shared with the other reactors' pacers.
    pub fn share_ports(&mut self, load: Arc<PortLoad>, now: Nanos) {
        self.windows.share_ports(load, now);
    }

    /// Flow `flow` came in on port `port` (see [`PortLoad`]).
    pub fn flow_port(&mut self, flow: u64, port: usize) {
        self.windows.flow_port(flow, port);
    }

    /// Removes a queued IO (its connection died). False if not queued here.
    pub fn cancel(&mut self, id: u64) -> bool {
        for (di, d) in self.sched.devices.iter_mut().enumerate() {
            if let Some(io) = d.queue.remove(id) {
                self.sched.tenants.clock.dequeued(io.tenant);
                self.windows.flows.unqueued(io.flow, u64::from(io.bytes));
                let tenants = &mut self.sched.tenants;
                tenants.unqueue(io.tenant, u64::from(io.bytes));
                let t = &mut tenants[io.tenant];
                if !d.queue.has(io.tenant) {
                    t.active.retain(|&x| x != di);
                }
                self.windows.publish_link(&self.sched.tenants);
                // A reactor whose last connection died may poll no more.
                self.windows.publish_hosts();
                self.sched.publish_queued(self.windows.reactor());
                self.publish_ready_of(io.tenant);
                return true;
            }
        }
        if let Some(pos) = self.bypassed.iter().position(|io| io.id == id) {
            let io = self.bypassed.swap_remove(pos);
            self.windows.flows.unqueued(io.flow, u64::from(io.bytes));
            return true;
        }
        if let Some(f) = self.flights.remove(&id) {
            self.land(f);
            // This reactor may poll no more (its last connection died): the
            // others must not go on counting what it held.
            self.windows.publish_link(&self.sched.tenants);
            return true;
        }
        false
    }

    /// Releases what may go now into `out` (IO ids).
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<u64>) {
        self.polls += 1;
        self.sched.tenants.held = false;
        self.gates.wake = None;
        if self.queued() == 0 {
            return;
        }
        if self.cfg.mode == Mode::Rate {
            self.rate_credit.refill(&self.cfg, now);
            let in_flight = self.bytes_in_flight;
            self.rate_credit.tune(&self.cfg, in_flight, now);
        }
        self.windows.sample_ports(now);
        self.windows.check_stalls(&self.cfg, now);
        self.windows.set_now(&self.cfg, &mut self.sched, now);
        self.release_bypassed(now, out);
        // Tenants that cannot release anything more in this poll (a reused
        // scratch vector: poll runs on every request).
        let mut skipped = std::mem::take(&mut self.skipped);
        skipped.clear();
        skipped.resize(self.sched.tenants.len(), false);
        for tenant in self.sched.tenants.iter_mut() {
            tenant.held = false;
        }
        self.device_waiters.clear();
        self.device_waiters
            .resize(self.sched.devices.len(), f64::INFINITY);
        // The least virtual time of a tenant that waits for the shared
        // window: tenants further ahead than the slack wait with it.
        let mut link_waiter: Option<f64> = None;
        // Turns passed on since the last release: a verdict that never
        // ends would hang the reactor (a turn passes only to a device that
        // may go, or adds a DRR quantum, so this bound is never reached).
        let mut turns = 0u32;
        self.windows.poll_memo.begin();
        while let Some(t) = self.sched.tenants.pick(&skipped) {
            match self.admit(t, link_waiter, now) {
                Verdict::Release(grant) => {
                    self.release(t, grant, now);
                    out.push(grant.io.id);
                    turns = 0;
                }
                Verdict::NextDevice if turns >= 1 << 20 => {
                    debug_assert!(false, "tenant {t}: its turns pass on without end");
                    skipped[t] = true;
                }
                Verdict::NextDevice => {
                    turns += 1;
                    self.sched.tenants[t].active.rotate_left(1);
                }
                Verdict::Skip | Verdict::WaitForOwnPorts => skipped[t] = true,
                Verdict::WaitForLink => {
                    skipped[t] = true;
                    let v = self.sched.tenants.clock.vtime(t);
                    link_waiter = Some(link_waiter.map_or(v, |w| w.min(v)));
                }
                Verdict::HoldForPeers => {
                    skipped[t] = true;
                    self.sched.tenants.held = true;
                    self.sched.tenants[t].held = true;
                }
            }
        }
        self.skipped = skipped;
        self.publish_ready();
        self.windows.poll_memo.end();
        self.windows.publish_link(&self.sched.tenants);
        self.windows.publish_hosts();
        self.sched.publish_queued(self.windows.reactor());
    }

    /// IOs that bypass pacing go at once.
    fn release_bypassed(&mut self, now: Nanos, out: &mut Vec<u64>) {
        // Drained, not dropped: the next IOs reuse its buffer (in the modes
        // that bypass, every IO comes this way).
        let mut bypassed = std::mem::take(&mut self.bypassed);
        for io in bypassed.drain(..) {
            self.sched.tenants[io.tenant].usage_bytes += u64::from(io.bytes);
            // The gate counts every flight it will see land (none of
            // these is light: it bypassed the pacer).
            self.gates.released(io.tenant, None, false, now);
            self.take_flight(io, false, u64::from(io.bytes), now);
            out.push(io.id);
        }
        if self.bypassed.is_empty() {
            self.bypassed = bypassed;
        }
    }

    /// Counts a released IO as in flight until `on_complete` or `cancel`.
    fn take_flight(&mut self, io: PacedIo, took_op: bool, paced: u64, now: Nanos) {
        let bytes = u64::from(io.bytes);
        let dev = &mut self.sched.devices[io.device];
        let work = dev.work(io.kind, bytes);
        dev.largest_io = dev.largest_io.max(bytes);
        dev.largest_request = dev.largest_request.max(u64::from(io.request));
        dev.probe.released(now);
        let lone = self.windows.flows.released(io.flow, bytes);
        // A read goes to its device as it is released; a write piece when
        // its payload has arrived (`on_device_start`).
        let stage = match io.kind {
            IoKind::Read => {
                self.sched.devices[io.device].arrive(work, io.tenant, now);
                self.gates.arrive(io.device, now);
                self.windows.flows.enter_pipe(io.flow, bytes, paced, now);
                DeviceStage::At
            }
            IoKind::Write => {
                self.filling += 1;
                DeviceStage::Before
            }
        };
        self.sched.tenants[io.tenant].in_flight += 1;
        self.bytes_in_flight += bytes;
        self.in_flight_avg.update(now, self.bytes_in_flight);
        self.released_total += bytes;
        let earlier = self.flights.insert(
            io.id,
            Flight {
                flow: io.flow,
                kind: io.kind,
                stage,
                device: io.device,
                tenant: io.tenant,
                bytes,
                work,
                released_at: now,
                took_op,
                paced,
                at_device: 0,
                lone,
            },
        );
        debug_assert!(earlier.is_none(), "IO {} released twice", io.id);
        self.ios += 1;
        self.windows.poll_memo.changed();
    }

    /// Released IO `id` (a write piece whose payload has arrived) goes to
    /// its device now.
    pub fn on_device_start(&mut self, id: u64, now: Nanos) {
        let Some(f) = self.flights.get_mut(&id) else {
            debug_assert!(false, "IO {id} starts at its device, never released");
            return;
        };
        if f.enter(DeviceStage::At) {
            debug_assert!(self.filling > 0, "a piece starts that was not filling");
            self.filling -= 1;
            self.sched.devices[f.device].arrive(f.work, f.tenant, now);
            self.gates.arrive(f.device, now);
            self.windows.flows.enter_pipe(f.flow, f.bytes, f.paced, now);
        }
    }

    /// The device finished IO `id` after `latency_ns` at the device: it no
    /// longer counts against the device's window.
    pub fn on_device_complete(&mut self, id: u64, kind: IoKind, latency_ns: u64, now: Nanos) {
        let Some(f) = self.flights.get_mut(&id) else {
            return;
        };
        let (device, work, bytes, t) = (f.device, f.work, f.bytes, f.tenant);
        f.at_device = latency_ns;
        if f.enter(DeviceStage::After) {
            self.sched.devices[device].leave(work, t, Some(now));
            self.gates.device_done(device, latency_ns, now);
        }
        let dev = &mut self.sched.devices[device];
        dev.probe.landed(latency_ns, bytes, dev.in_flight_ios, now);
        dev.device_latency.update(latency_ns.max(1), now);
        dev.note_wait(latency_ns, work, now);
        self.gates.record(device, kind, latency_ns, now);
    }

    /// The IO is done and its data has left (reply sent): its window frees,
    /// and its release-to-done time and bytes feed the estimators.
    pub fn on_complete(&mut self, id: u64, now: Nanos) {
        let flight = self.flights.remove(&id);
        debug_assert!(flight.is_some(), "IO {id} done but not in flight");
        let Some(f) = flight else { return };
        debug_assert!(now >= f.released_at, "IO done before its release");
        let latency = (now - f.released_at).max(1);
        // Only the largest IOs size the window: they hold their buffers
        // longest, and with half-size IOs counted too (64 KiB beside 128
        // KiB pieces) the min latency was theirs, the windows too small
        // for the bytes the large ones move, and mixed sizes beside slow
        // devices kept 88-92% of the link.
        let large = f.bytes >= self.windows.max_io;
        self.windows.latency.update(latency, large, now);
        // A device's own largest IOs tell its hold too, scaled up to the
        // largest IO (no less than it would take for one). Without them, a
        // reactor whose largest IOs all went to 5 ms drives took their hold
        // as the fastest: every hold ratio 1, their queues filled
        // `max_window`, 1 ms drives' readers got 52% of their share (1:98).
        let own_largest = !large && f.bytes >= self.sched.devices[f.device].largest_io;
        let fastest = if own_largest {
            let scaled = u128::from(latency) * u128::from(self.windows.max_io);
            u64::try_from(scaled / u128::from(f.bytes.max(1))).unwrap_or(u64::MAX)
        } else {
            latency
        };
        self.windows
            .fastest
            .update(fastest, large || own_largest, now);
        let dev = &mut self.sched.devices[f.device];
        dev.latency.update(latency, large, now);
        dev.delivered += f.bytes;
        dev.delivered_work += f.work;
        self.windows.port_delivered(&f);
        self.land(f);
        self.windows.flow_delivered(&self.cfg, &self.sched, &f, now);
        self.rate_credit.completed();
        self.windows.sample_rates(&mut self.sched.devices, now);
        // A connection's writes come one at a time: the next header is
        // read only after this payload, so while a piece fills, nothing
        // waits in the pacer though the writer has more.
        let backlogged = self.queued() > 0 || self.filling > 0;
        let devices = &self.sched.devices;
        self.windows
            .learn_depth(&self.cfg, devices, &f, latency, backlogged, now);
        self.in_flight_avg.update(now, self.bytes_in_flight);
    }

    fn land(&mut self, f: Flight) {
        if f.stage == DeviceStage::Before {
            debug_assert!(self.filling > 0, "a piece lands that was not filling");
            self.filling -= 1;
        } else {
            self.windows.flows.leave_pipe(f.flow, f.bytes, f.paced);
        }
        self.windows.flows.landed(f.flow, f.bytes);
        if f.stage == DeviceStage::At {
            self.sched.devices[f.device].leave(f.work, f.tenant, None);
            self.gates.leave(f.device);
        }
        let t = &mut self.sched.tenants[f.tenant];
        debug_assert!(
            t.in_flight > 0,
            "tenant {}: lands more than it has in flight",
            t.name
        );
        t.in_flight -= 1;
        self.gates.landed(f.tenant, f.device, f.took_op);
        debug_assert!(
            self.bytes_in_flight >= f.bytes,
            "lands more than is in flight"
        );
        self.bytes_in_flight -= f.bytes;
    }

    /// When the next poll could release something without a completion
    /// arriving first (rate mode's next credit, a device's budget, a held
    /// tenant's recheck), if anything is queued.
    pub fn next_wakeup(&self, now: Nanos) -> Option<Nanos> {
        if self.queued() == 0 {
            return None;
        }
        let mut wake = self.gates.wake;
        let mut at = |t: Nanos| wake = Some(wake.map_or(t, |w| w.min(t)));
        if self.sched.tenants.held {
            // Nothing here completes when another reactor's tenant catches up.
            at(now + HOLD_RECHECK_NS);
        }
        if let Some(end) = self.windows.probe_end(&self.cfg, now) {
            // The window reopens when the latency probe ends.
            at(end);
        }
        // A flow that stalls frees its host's and the reactor's windows,
        // with no completion to say so.
        if let Some(t) = self.windows.next_stall_check(&self.cfg) {
            at(t);
        }
        if self.cfg.mode == Mode::Rate {
            match self.rate_credit.credit_at(now) {
                Some(t) => at(t),
                // Credit is there; unless a device's budget is what holds
                // the queue (then its time is already in `wake`), poll now.
                None if self.gates.wake.is_none() => at(now),
                None => {}
            }
        }
        wake
    }
}

#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod ceil_tests;
