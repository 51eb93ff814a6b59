//! `admit`: the verdict on a tenant's turn, the order in which the
//! components are asked. Which IO goes, or why none does: its tenant waits
//! for others, no device may serve the turn (`turn_server`: its flows'
//! windows), the mode's own limit (`rate`'s credit, `auto`'s windows), the
//! device's latency budget or cap, `rate`'s device op limit or `auto`'s DRR
//! debt. [`Pacer::poll`] acts on the verdict; `release` carries out a
//! release.

use super::ablate::{self, Mechanism};
use super::census::Held;
use super::drr::FAST_HOLD_RATIO;
use super::queues::Slot;
use super::tenant_clock::{device_bits, DeviceMask};
use super::{Mode, PacedIo, Pacer};
use crate::Nanos;

/// What `poll` does with a tenant's turn (see `Pacer::admit`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Verdict {
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
    /// The tenant waits for full ports that no other tenant's flows use:
    /// nothing more of it goes in this poll, as with `WaitForLink`, but it
    /// holds no tenant back and banks no credit (it is lifted).
    WaitForOwnPorts,
    /// The tenant runs too far ahead of one busy on another reactor and
    /// waits for it (rechecked soon, see `next_wakeup`).
    HoldForPeers,
}

/// An IO `admit` lets go, with what its release charges.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    /// The device whose DRR turn it is.
    pub front: usize,
    /// The device that serves the turn (see `turn_server`).
    pub device: usize,
    pub slot: Slot,
    pub io: PacedIo,
    /// The device's hold ratio (see `link_ratio`).
    pub ratio: f64,
    /// What it counts against the shared window (see `link_share`).
    pub paced: u64,
    pub took_op: bool,
    /// Nothing another tenant wants stands on its path (see
    /// `uncontended_io`): it goes past the tenants' order and is not
    /// charged to its tenant's virtual time.
    pub uncontended: bool,
}

impl Pacer {
    /// The verdict on tenant `t`'s turn: which IO goes, or why none does.
    /// `link_waiter` is the least virtual time of a tenant waiting for the
    /// shared window in this poll.
    pub(super) fn admit(&mut self, t: usize, link_waiter: Option<f64>, now: Nanos) -> Verdict {
        if let Some(v) = self.tenant_order(t, link_waiter, now) {
            return v;
        }
        // The device whose DRR turn it is (`front`), and the one that
        // serves it (`d`: the same, or the fast device with the oldest IO).
        let Some(front) = self.sched.front_device(t) else {
            return Verdict::Skip;
        };
        let Some((d, slot)) = self.turn_server(t, front, now) else {
            return self.no_server(t, front, now);
        };
        let io = self.sched.devices[d].queue.io(slot);
        let bytes = u64::from(io.bytes);
        // One hold ratio per release: the shared window, the charge and
        // the flight all use it.
        let ratio = self.windows.link_ratio(&self.cfg, &self.sched.devices, d);
        let paced = super::ceil_u64(bytes as f64 / ratio);
        if let Some(v) = self.mode_gate(t, d, &io, paced, now) {
            return v;
        }
        let ready = self.sched.tenants.light(t)
            || (self.gates.qos_ready(d, now)
                && self
                    .gates
                    .gate_ready(d, self.sched.devices[d].in_flight_ios > 0, now));
        if !ready {
            // This device waits for budget (its latency target) or for
            // its cap (beside a light tenant); the tenant's other devices
            // need not. A light tenant's IO is within its share, as
            // iocost's per-cgroup budgets have it: it is charged but does
            // not wait.
            return self.next_device_or(t, d, Verdict::Skip, |p| p.all_windows_closed(t, now));
        }
        let took_op = match self.gates.take_op(self.cfg.mode, d) {
            Some(true) => true,
            Some(false) => {
                return self.next_device_or(t, d, Verdict::Skip, |p| {
                    p.gates.ops_exhausted(&p.sched.tenants[t].active)
                })
            }
            None => false,
        };
        if self.cfg.mode == Mode::Auto
            && !self
                .sched
                .drr_turn(t, front, self.windows.max_io as i64, now)
        {
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
            uncontended: false,
        })
    }

    /// Whether the tenants' order holds tenant `t` (see `Tenants::gate`),
    /// and if it does, what goes: an IO no other tenant wants still may,
    /// since weights divide only what tenants share.
    fn tenant_order(&mut self, t: usize, link_waiter: Option<f64>, now: Nanos) -> Option<Verdict> {
        let windows = &self.windows;
        let v = self
            .sched
            .tenants
            .gate(t, link_waiter, windows.reactor(), |u| {
                windows.may_share_link(t, u)
            })?;
        if !matches!(v, Verdict::Skip | Verdict::HoldForPeers) {
            return Some(v);
        }
        Some(self.uncontended_io(t, now).map_or(v, Verdict::Release))
    }

    /// An IO of tenant `t` that no other tenant contends: its flow's link
    /// is its tenant's own (a known port with room, or full with only its
    /// tenant's flows), its device keeps no queue of its own and no other
    /// tenant has IO there whose flow may go (on any reactor), and every
    /// window, budget and gate on its way has room. None in other modes,
    /// or with it taken out. Fuzz 1:3: a tenant held to the weights by a
    /// tenant on another link and other drives got 11% of its share.
    fn uncontended_io(&mut self, t: usize, now: Nanos) -> Option<Grant> {
        if self.cfg.mode != Mode::Auto || ablate::out(Mechanism::Uncontended) {
            return None;
        }
        let contended = self.others_ready(t);
        // By index: the budgets and the gate note their wakeups.
        for i in 0..self.sched.tenants[t].active.len() {
            let d = self.sched.tenants[t].active[i];
            if contended & device_bits([d]) != 0 {
                continue;
            }
            let Some((slot, io, ratio, paced)) = self.uncontended_head(t, d) else {
                continue;
            };
            let busy = self.sched.devices[d].in_flight_ios > 0;
            if self.gates.qos_ready(d, now) && self.gates.gate_ready(d, busy, now) {
                return Some(Grant {
                    front: self.sched.front_device(t)?,
                    device: d,
                    slot,
                    io,
                    ratio,
                    paced,
                    took_op: false,
                    uncontended: true,
                });
            }
        }
        None
    }

    /// Tenant `t`'s oldest IO at device `d` on its tenant's own link, if
    /// the device keeps no queue and the shared and device windows have
    /// room for it (see `uncontended_io`), with its hold ratio and link
    /// share.
    fn uncontended_head(&self, t: usize, d: usize) -> Option<(Slot, PacedIo, f64, u64)> {
        let (w, cfg, sched) = (&self.windows, &self.cfg, &self.sched);
        if w.device_bound(&sched.devices, d) {
            return None;
        }
        let queue = &sched.devices[d].queue;
        let own = |io: &PacedIo| w.tenants_own_link(io.flow) && w.flow_open(cfg, sched, io);
        let slot = queue.head(t, own)?;
        let io = queue.io(slot);
        let bytes = u64::from(io.bytes);
        let ratio = w.link_ratio(cfg, &sched.devices, d);
        let paced = super::ceil_u64(bytes as f64 / ratio);
        let in_flight = self.bytes_in_flight;
        let room = w.shared_window_open(cfg, &sched.tenants, t, paced, bytes, in_flight)
            && self.device_open(t, d, &io);
        room.then_some((slot, io, ratio, paced))
    }

    /// The devices where another tenant than `t` has IO whose flow may
    /// go, here or on another reactor (at the end of each one's last
    /// poll): what `t` would contend for there.
    fn others_ready(&self, t: usize) -> u64 {
        let tenants = &self.sched.tenants;
        let reactor = self.windows.reactor();
        (0..tenants.len()).filter(|&u| u != t).fold(0, |mask, u| {
            let elsewhere = reactor.map_or(0, |r| {
                (tenants.clock).devices_elsewhere(DeviceMask::Ready, u, r)
            });
            mask | tenants[u].ready_devices | elsewhere
        })
    }

    /// Each tenant's devices where its IO's flow may go, for `others_ready`
    /// here and on the other reactors, and when the oldest of those IOs
    /// arrived, for `TenantClock::holds_oldest` (`auto`, 2 or more
    /// tenants). Only IO whose flow may go claims the tenant's slots first:
    /// IO held by its own flow's window waits for its own link, not the
    /// shared window, and it held a tenant's host alone on a 185 Gb/s port
    /// to 11% of its share beside the tenant's hosts behind a full 37 Gb/s
    /// one (fuzz 1:15).
    pub(super) fn publish_ready(&mut self) {
        for t in 0..self.sched.tenants.len() {
            self.publish_ready_of(t);
        }
    }

    /// `publish_ready` for tenant `t` alone (a cancel changes only its
    /// queue).
    pub(super) fn publish_ready_of(&mut self, t: usize) {
        if self.cfg.mode != Mode::Auto || self.sched.tenants.len() < 2 {
            return;
        }
        let uncontended = !ablate::out(Mechanism::Uncontended);
        let (mask, oldest) = self.ready_heads(t);
        if uncontended {
            self.sched.tenants[t].ready_devices = mask;
        }
        if let Some(r) = self.windows.reactor() {
            let clock = &self.sched.tenants.clock;
            if uncontended {
                clock.set_devices(DeviceMask::Ready, t, r, mask);
            }
            clock.set_oldest(t, r, oldest);
        }
    }

    /// Tenant `t`'s devices where its IO's flow may go (bits `d % 64`),
    /// and the arrival of its oldest such IO.
    fn ready_heads(&self, t: usize) -> (u64, Option<Nanos>) {
        let tenant = &self.sched.tenants[t];
        if tenant.queued == 0 {
            return (0, None);
        }
        let heads = tenant.active.iter().filter_map(|&d| {
            let slot = self.windows.head(&self.cfg, &self.sched, d, t)?;
            Some((d, self.sched.devices[d].queue.arrived(slot)))
        });
        heads.fold((0, None), |(mask, oldest), (d, at)| {
            let oldest = oldest.map_or(at, |o: Nanos| o.min(at));
            (mask | device_bits([d]), Some(oldest))
        })
    }

    /// The verdict when no device may serve tenant `t`'s turn at `front`:
    /// every flow with IO at this turn's device (and, for a fast device,
    /// at every fast device: see `turn_server`) waits for its window. A
    /// slow device's turn goes to the next device, if one may go.
    /// Otherwise the tenant waits for its flows' links, and like one
    /// waiting for the shared window holds back tenants ahead of it: a
    /// link it shares with them is theirs to take only by weight, and its
    /// slow devices take no more than their DRR turns. Unless the fast
    /// device keeps a queue of its own: its flows wait for the device, not
    /// their links, and a slow device's turn waiting with them left the
    /// slow drives idle (`slow_devices_open_link` with 4 reactors: 35 of
    /// 47 Gb/s at QD 128).
    fn no_server(&mut self, t: usize, front: usize, now: Nanos) -> Verdict {
        // Its flows' windows, not the reactor's shared one, hold it: a full
        // port only its flows use is its own (see `shared_or_own_ports`).
        let waits = match self.link_wait(t) {
            Verdict::WaitForLink => self.shared_or_own_ports(t),
            waits => waits,
        };
        let devices = &self.sched.devices;
        if self.windows.link_ratio(&self.cfg, devices, front) < FAST_HOLD_RATIO
            && !self.windows.device_bound(devices, front)
            && matches!(waits, Verdict::WaitForLink | Verdict::WaitForOwnPorts)
        {
            return waits;
        }
        self.next_device_or(t, front, waits, |p| p.all_windows_closed(t, now))
    }

    /// How tenant `t` waits when every flow it could serve waits for its
    /// window: for a link it may share (`WaitForLink`, holding back
    /// tenants ahead of it), or, when every flow it has queued came in on
    /// a port with room (see `ports.rs`), for links of its own: it holds
    /// no one back and banks no credit for the service it cannot take
    /// (a weight-2 tenant on its own 10 GbE link held two weight-1 hosts
    /// on 100 GbE to 2-6% of their share).
    fn link_wait(&self, t: usize) -> Verdict {
        // A flow at its cap in a full port's pool waits for its own rate.
        let shared = |io: &PacedIo| {
            let deepen = |w| {
                self.windows
                    .deepen_at(&self.cfg, &self.sched.devices, io.device, w)
            };
            !self.windows.own_link(io.flow)
                && !self
                    .windows
                    .flows
                    .at_pool_cap(io.flow, u64::from(io.bytes), deepen)
        };
        let own = self.cfg.mode == Mode::Auto
            && self.sched.tenants[t].active.iter().all(|&d| {
                !self.windows.device_bound(&self.sched.devices, d)
                    && self.sched.devices[d].queue.head(t, shared).is_none()
            });
        if !own {
            return Verdict::WaitForLink;
        }
        self.sched.tenants.clock.lift(t);
        Verdict::Skip
    }

    /// A tenant whose flows wait for full ports waits for links it shares
    /// (`WaitForLink`), unless only its own flows came in on those ports:
    /// then it shares them with no tenant, and waiting for them must not
    /// hold the others back (fuzz 1:36: a weight-8 tenant alone behind a
    /// 9.2 Gb/s port held two tenants on a 370 Gb/s port at 30% of their
    /// share). Its slow devices still take no more than their turns.
    fn shared_or_own_ports(&self, t: usize) -> Verdict {
        let alone = |io: &PacedIo| self.windows.tenants_own_link(io.flow);
        let all_alone = self.cfg.mode == Mode::Auto
            && self.sched.tenants[t].active.iter().all(|&d| {
                self.sched.devices[d]
                    .queue
                    .head(t, |io| !alone(io))
                    .is_none()
            });
        if !all_alone {
            return Verdict::WaitForLink;
        }
        self.sched.tenants.clock.lift(t);
        Verdict::WaitForOwnPorts
    }

    /// The mode's own limit on releasing `io` to device `d` (None: it
    /// allows it). `paced` is the IO's link share (see `link_share`).
    pub(super) fn mode_gate(
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
            Mode::Rate => {
                (!(self.bypass(io) || self.rate_credit.has_credit())).then_some(Verdict::Skip)
            }
            // The shared window waits for the device whose turn it is: a
            // smaller-charged IO behind it must not take the gap, or DRR's
            // shares would not hold.
            Mode::Auto
                if !self.windows.shared_window_open(
                    &self.cfg,
                    &self.sched.tenants,
                    t,
                    paced,
                    bytes,
                    self.bytes_in_flight,
                ) =>
            {
                Some(self.link_wait(t))
            }
            Mode::Auto => {
                // This device's window is full; the turn goes to the next one.
                let open = self.device_turn(t, d, io);
                (!open).then(|| {
                    self.next_device_or(t, d, Verdict::Skip, |p| p.all_windows_closed(t, now))
                })
            }
        }
    }

    /// Device `d`'s window has room for tenant `t`'s `io`, and no tenant
    /// behind `t` in virtual time waits for that room in this poll. Else
    /// `t` waits for it too. A large IO needs a large gap: while the gaps
    /// went to whoever fitted, a weight-2 tenant's 256 KiB writes beside a
    /// 4 KiB reader on one drive got 9-47% of their share (fuzz 1:16).
    /// Its tenant's part of the device (see `tenant_part`) holds only it:
    /// the others go on to what it leaves.
    fn device_turn(&mut self, t: usize, d: usize, io: &PacedIo) -> bool {
        let open = self.device_window_free(t, d, io);
        if !open {
            let vtime = self.sched.tenants.clock.vtime(t);
            if let Some(w) = self.device_waiters.get_mut(d) {
                *w = w.min(vtime);
            }
        }
        open && self.tenant_part_open(t, d)
    }

    /// Device `d` has room for tenant `t`'s `io` in this poll: in its
    /// window (see `device_turn`) and in the tenant's part of it.
    fn device_open(&self, t: usize, d: usize, io: &PacedIo) -> bool {
        self.device_window_free(t, d, io) && self.tenant_part_open(t, d)
    }

    /// (Asked for each IO a poll looks at: with one tenant, no part.)
    fn tenant_part_open(&self, t: usize, d: usize) -> bool {
        let tenants = &self.sched.tenants;
        tenants.len() < 2 || self.sched.devices[d].tenant_part_open(|u| tenants[u].weight, t)
    }

    fn device_window_free(&self, t: usize, d: usize, io: &PacedIo) -> bool {
        let vtime = self.sched.tenants.clock.vtime(t);
        // (Sized at each poll; a device added since has no waiter.)
        let waiter = self.device_waiters.get(d).copied();
        (ablate::out(Mechanism::DeviceWaiter) || waiter.is_none_or(|w| w > vtime))
            && self
                .windows
                .device_window_open(&self.cfg, &self.sched, d, io)
    }

    /// Releases the IO `admit` granted tenant `t`: out of its queue, charged
    /// to the tenant's virtual time, the device's DRR turn and its budget,
    /// and counted in flight.
    pub(super) fn release(&mut self, t: usize, g: Grant, now: Nanos) {
        let (d, front, io) = (g.device, g.front, g.io);
        let bytes = u64::from(io.bytes);
        // A device's bytes are charged by how long they hold buffers, so
        // when the link is short each device's share falls as 1/latency,
        // what Little's law gives devices at equal queue depth: a slow
        // device neither starves nor crowds fast ones off the link.
        let charge = (bytes as f64 * g.ratio) as i64;
        // Deficit round robin by cost between this tenant's devices.
        let dev = &self.sched.devices[d];
        let cost = dev
            .cost()
            .cost(io.kind, io.bytes, io.offset == dev.last_offset);
        let light = self.sched.tenants.light(t);
        self.gates.released(t, Some((d, cost)), light, now);
        self.sched.take(t, d, front, g.slot, &io);
        // `auto` refills a spent turn when the device's next turn comes
        // (see `drr_turn`).
        let refill = (self.cfg.mode != Mode::Auto).then_some(self.windows.max_io as i64);
        // Uncontended IO took nothing another tenant wanted.
        let tenant_cost = if g.uncontended { 0.0 } else { cost };
        self.sched
            .charge(t, front, bytes, charge, tenant_cost, refill);
        if self.cfg.mode == Mode::Rate {
            self.rate_credit.spend(bytes);
        }
        self.take_flight(io, g.took_op, g.paced, now);
    }

    /// Which device serves tenant `t`'s turn at `front`, and the position of
    /// its IO there. In `auto`, a fast device's turn goes to the fast device
    /// (one holding buffers under twice the fastest's time) whose oldest IO
    /// of this tenant has waited longest and that may take it now: fast
    /// devices then drain as one FIFO queue. With turns kept per device,
    /// random arrivals leave some queues much deeper than others while each
    /// gets the same rate, and their IOs wait several times longer. Slow
    /// devices keep their own turns and charges.
    pub(super) fn turn_server(
        &mut self,
        t: usize,
        front: usize,
        now: Nanos,
    ) -> Option<(usize, Slot)> {
        let front_slot = self.windows.head(&self.cfg, &self.sched, front, t);
        if self.cfg.mode != Mode::Auto
            || self.windows.hold_ratio(&self.sched.devices, front) >= FAST_HOLD_RATIO
        {
            return front_slot.map(|s| (front, s));
        }
        let mut best = (front_slot.map(|s| (front, s)), Nanos::MAX);
        // By index: `qos_ready` notes when a device waiting for budget may
        // go, as the front's own check would.
        for i in 0..self.sched.tenants[t].active.len() {
            let d = self.sched.tenants[t].active[i];
            let Some(slot) = self.windows.head(&self.cfg, &self.sched, d, t) else {
                continue;
            };
            let q = &self.sched.devices[d].queue;
            let arrived = q.arrived(slot);
            if arrived >= best.1
                || self.windows.hold_ratio(&self.sched.devices, d) >= FAST_HOLD_RATIO
                || !self.device_open(t, d, &q.io(slot))
                || !self.gates.qos_ready(d, now)
                || !(self.sched.tenants.light(t)
                    || self
                        .gates
                        .gate_ready(d, self.sched.devices[d].in_flight_ios > 0, now))
            {
                continue;
            }
            best = (Some((d, slot)), arrived);
        }
        best.0
    }

    /// Device `d` cannot take tenant `t`'s IO now: its turn goes to the
    /// tenant's next device if another has IO and `others_blocked` says one
    /// of them may go; otherwise `otherwise`.
    pub(super) fn next_device_or(
        &mut self,
        t: usize,
        d: usize,
        otherwise: Verdict,
        others_blocked: impl FnOnce(&mut Self) -> bool,
    ) -> Verdict {
        if self.sched.tenant_has_other_device(t, d) && !others_blocked(self) {
            Verdict::NextDevice
        } else {
            otherwise
        }
    }

    /// No device of tenant `t` can take its next IO now: its windows (in
    /// `auto`) are full or it waits for budget.
    pub(super) fn all_windows_closed(&mut self, t: usize, now: Nanos) -> bool {
        // By index: `qos_ready` notes wakeups, and this runs on every poll
        // that finds a window full, so no copy of the list is made.
        for i in 0..self.sched.tenants[t].active.len() {
            let d = self.sched.tenants[t].active[i];
            let Some(slot) = self.windows.head(&self.cfg, &self.sched, d, t) else {
                continue;
            };
            let io = self.sched.devices[d].queue.io(slot);
            let bytes = u64::from(io.bytes);
            let (w, cfg, sched) = (&self.windows, &self.cfg, &self.sched);
            let windows = cfg.mode != Mode::Auto
                || (w.shared_window_open(
                    cfg,
                    &sched.tenants,
                    t,
                    w.link_share(cfg, &sched.devices, d, bytes),
                    bytes,
                    self.bytes_in_flight,
                ) && self.device_open(t, d, &io));
            if windows
                && self.gates.qos_ready(d, now)
                && (self.sched.tenants.light(t)
                    || self
                        .gates
                        .gate_ready(d, self.sched.devices[d].in_flight_ios > 0, now))
            {
                return false;
            }
        }
        true
    }

    /// Where each tenant's queued IO waits now (`auto` only; other modes
    /// have no windows, and every tenant counts as `open`).
    pub fn census(&self) -> Vec<Held> {
        let mut out = vec![Held::default(); self.sched.tenants.len()];
        for (d, dev) in self.sched.devices.iter().enumerate() {
            for (t, held) in out.iter_mut().enumerate() {
                if !dev.queue.has(t) {
                    continue;
                }
                if self.cfg.mode != Mode::Auto {
                    held.open += 1;
                    continue;
                }
                let Some(slot) = self.windows.head(&self.cfg, &self.sched, d, t) else {
                    held.flows += 1;
                    continue;
                };
                let io = dev.queue.io(slot);
                let bytes = u64::from(io.bytes);
                let paced = self
                    .windows
                    .link_share(&self.cfg, &self.sched.devices, d, bytes);
                let shared = self.windows.shared_window_open(
                    &self.cfg,
                    &self.sched.tenants,
                    t,
                    paced,
                    bytes,
                    self.bytes_in_flight,
                );
                match (shared, self.device_open(t, d, &io)) {
                    (false, _) => held.reactor += 1,
                    (true, false) => held.device += 1,
                    (true, true) => held.open += 1,
                }
            }
        }
        out
    }
}
