//! Tenants: each release opportunity goes to the queued tenant with the
//! least virtual time (weighted fair queuing over IO cost, see
//! [`TenantClock`](super::TenantClock)), and a tenant running too far ahead
//! of one busy on another reactor waits for it.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};
use std::sync::Arc;

use super::ablate::{self, Mechanism};
use super::tenant_clock::{device_bits, DeviceMask};
use super::{TenantClock, TenantConfig, Verdict};
use crate::Nanos;

/// How far (cost units per unit of weight, i.e. ns of device time) a tenant
/// may run ahead of a busy tenant served on another reactor before it waits.
const TENANT_SLACK: f64 = 1_000_000.0;

/// A tenant held to its share waits here while another reactor holds an
/// IO of it older by more than this (see `TenantClock::holds_oldest`).
const TENANT_FIFO_TOLERANCE_NS: Nanos = 1_000_000;

/// How soon a pacer holding a tenant back looks again.
pub(super) const HOLD_RECHECK_NS: Nanos = 20_000;

#[derive(Debug, Clone)]
pub(super) struct Tenant {
    pub name: String,
    pub weight: f64,
    pub queued: usize,
    /// Devices of this tenant with queued IOs, in round-robin order.
    pub active: VecDeque<usize>,
    pub usage_bytes: u64,
    /// IOs released by this pacer and not yet done.
    pub in_flight: u32,
    pub queued_bytes: u64,
    /// The last poll held it back for a tenant served on another reactor.
    pub held: bool,
    /// The devices where its IO's flow may go, as bits `d % 64`, at the
    /// end of the last poll (see `Pacer::others_ready`).
    pub ready_devices: u64,
}

impl Tenant {
    /// The devices it has IO queued at here, as bits `d % 64` (what the
    /// tenant clock shares with the other reactors, see `competes`).
    pub fn queued_devices(&self) -> u64 {
        device_bits(self.active.iter().copied())
    }

    pub fn new(name: &str, weight: f64) -> Tenant {
        Tenant {
            name: name.into(),
            weight,
            queued: 0,
            active: VecDeque::new(),
            usage_bytes: 0,
            in_flight: 0,
            queued_bytes: 0,
            held: false,
            ready_devices: 0,
        }
    }

    /// One per configured tenant, or the default tenant if none is.
    pub fn from_config(tenants: &[TenantConfig]) -> Vec<Tenant> {
        if tenants.is_empty() {
            return vec![Tenant::new("default", 1.0)];
        }
        tenants
            .iter()
            .map(|t| Tenant::new(&t.name, t.weight))
            .collect()
    }

    /// One IO of `bytes` left the tenant's queue (released or cancelled).
    pub fn unqueue(&mut self, bytes: u64) {
        debug_assert!(
            self.queued > 0 && self.queued_bytes >= bytes,
            "tenant {}: leaves its queue more than it joined",
            self.name
        );
        self.queued -= 1;
        self.queued_bytes -= bytes;
    }
}

/// The tenants and their virtual time: which tenant each release
/// opportunity goes to (WFQ), and which wait for peers on other reactors.
pub(super) struct Tenants {
    all: Vec<Tenant>,
    /// IOs queued over all tenants, kept as each joins and leaves: `queued`
    /// runs several times per IO.
    queued: usize,
    /// Tenants' virtual time: this pacer's own, or shared by all reactors.
    pub clock: Arc<TenantClock>,
    /// The last poll held a tenant back for one served on another reactor.
    pub held: bool,
}

impl Tenants {
    /// One per configured tenant, or the default tenant if none is, on a
    /// clock of their own.
    pub fn new(tenants: &[TenantConfig]) -> Tenants {
        let all = Tenant::from_config(tenants);
        let clock = TenantClock::new(all.len());
        Tenants {
            all,
            queued: 0,
            clock,
            held: false,
        }
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Tenant> {
        self.all.iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Tenant> {
        self.all.iter_mut()
    }

    /// Takes the configured weights (the tenants stay what they were).
    pub fn reweight(&mut self, tenants: &[TenantConfig]) {
        for (t, tc) in self.all.iter_mut().zip(tenants) {
            t.weight = tc.weight;
        }
    }

    /// Shares virtual time with the other reactors' pacers, if `clock` is
    /// for as many tenants.
    pub fn share_clock(&mut self, clock: Arc<TenantClock>) {
        if clock.tenants() == self.all.len() {
            self.clock = clock;
        }
    }

    /// IOs queued, over all tenants.
    pub fn queued(&self) -> usize {
        debug_assert_eq!(
            self.queued,
            self.all.iter().map(|t| t.queued).sum::<usize>()
        );
        self.queued
    }

    /// One IO of tenant `t` joined its queue. A tenant that had none
    /// queued but IO in flight here has not been idle: its client sends the
    /// next request only as the last one moves (an NBD writer's next header
    /// follows the last payload, read only once released), and lifted to
    /// the busy tenants' time at each one, a weight-2 writer tenant took
    /// the same share as a weight-1 reader (fuzz 1:16). It keeps up to
    /// `TENANT_SLACK` of lag, which bounds what it may bank.
    pub fn queue(&mut self, t: usize) {
        let credit = if self.all[t].in_flight > 0 {
            TENANT_SLACK
        } else {
            0.0
        };
        self.clock.queued(t, credit);
        self.all[t].queued += 1;
        self.queued += 1;
    }

    /// One IO of tenant `t`, `bytes` long, left its queue (released or
    /// cancelled).
    pub fn unqueue(&mut self, t: usize, bytes: u64) {
        self.all[t].unqueue(bytes);
        self.queued -= 1;
    }

    /// Whether tenant `t` waits for other tenants before its devices are
    /// looked at (None: it need not). `reactor` is this reactor's index
    /// among those pooling their windows; `share_link(u)` says whether
    /// tenant `u` may share a full link with `t` (see `competes`).
    pub fn gate(
        &self,
        t: usize,
        link_waiter: Option<f64>,
        reactor: Option<usize>,
        share_link: impl Fn(usize) -> bool,
    ) -> Option<Verdict> {
        // The shared window is the link's, and a tenant waiting for it
        // waits for the link; one that took the gap instead would take
        // the link from it, whatever the weights. (A slow device's IO
        // counts a fraction of its bytes in the window, so a tenant of
        // slow devices always finds a gap.)
        let link_waiter = link_waiter.filter(|_| !ablate::out(Mechanism::LinkWaiter));
        if let Some(v) = link_waiter.filter(|_| !self.light(t)) {
            let ahead = self.clock.vtime(t) > v + TENANT_SLACK;
            // Held to its share, the tenant's slots go to the reactor
            // with its oldest IO, not to whichever polls first.
            let elsewhere =
                reactor.is_some_and(|r| !self.clock.holds_oldest(t, r, TENANT_FIFO_TOLERANCE_NS));
            if ahead || elsewhere {
                return Some(Verdict::Skip);
            }
        }
        // Tenants queued here are arbitrated here; one busy only on other
        // reactors is waited for if this one runs too far ahead of it.
        let here = self.all[t].queued_devices();
        let apart =
            |u: usize| self.all[u].queued > 0 || !self.competes(here, u, reactor, &share_link);
        if !ablate::out(Mechanism::HoldPeers) && self.clock.lead(t, apart) > TENANT_SLACK {
            return Some(Verdict::HoldForPeers);
        }
        None
    }

    /// Tenant `u`, busy on other reactors, competes with a tenant here for
    /// something weights divide: one of the devices it has IO queued at
    /// (`here`, see `Tenant::queued_devices`), or a full link
    /// (`share_link`). A tenant held to its share by one
    /// that shares nothing with it only idles what it could use: fuzz
    /// 1:34, a link-bound tenant on its own drives held at 31% of its
    /// share by a tenant on slow drives on another reactor.
    fn competes(
        &self,
        here: u64,
        u: usize,
        reactor: Option<usize>,
        share_link: impl Fn(usize) -> bool,
    ) -> bool {
        let Some(r) = reactor else { return true };
        here & self.clock.devices_elsewhere(DeviceMask::Queued, u, r) != 0 || share_link(u)
    }

    /// Tenant `t` has one IO here and nothing in flight (a QD 1 client): it
    /// goes past full windows and device budgets, so a light tenant's IO never waits for a heavy
    /// tenant's to complete. This adds at most one IO per light tenant.
    pub fn light(&self, t: usize) -> bool {
        let tenant = &self.all[t];
        tenant.in_flight == 0
            && tenant.queued <= 1
            && self.all.len() > 1
            && !ablate::out(Mechanism::Light)
    }

    /// The queued tenant with the least virtual time (weighted fair queuing).
    pub fn pick(&self, skipped: &[bool]) -> Option<usize> {
        self.all
            .iter()
            .enumerate()
            .filter(|(i, t)| t.queued > 0 && !t.active.is_empty() && !skipped[*i])
            .map(|(i, _)| i)
            .min_by(|&a, &b| self.clock.vtime(a).total_cmp(&self.clock.vtime(b)))
    }
}

impl Index<usize> for Tenants {
    type Output = Tenant;

    fn index(&self, t: usize) -> &Tenant {
        &self.all[t]
    }
}

impl IndexMut<usize> for Tenants {
    fn index_mut(&mut self, t: usize) -> &mut Tenant {
        &mut self.all[t]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_tenants_on_two_reactors() -> Tenants {
        let config = |name: &str| TenantConfig {
            name: name.into(),
            weight: 1.0,
            exports: vec![],
        };
        let mut tenants = Tenants::new(&[config("a"), config("b")]);
        tenants.share_clock(TenantClock::with_reactors(2, 2));
        tenants
    }

    #[test]
    fn a_tenant_waits_only_for_a_peer_it_competes_with() {
        let mut tenants = two_tenants_on_two_reactors();
        // Tenant 0 has IO queued here (reactor 0) at device 3, far ahead
        // of tenant 1, which is busy only on reactor 1, at device 5.
        tenants.all[0].queued = 1;
        tenants.all[0].active.push_back(3);
        tenants.clock.queued(0, 0.0);
        tenants.clock.queued(1, 0.0);
        tenants.clock.advance(0, 10.0 * TENANT_SLACK);
        tenants.clock.set_devices(DeviceMask::Queued, 1, 1, 1 << 5);
        let gate =
            |tenants: &Tenants, share_link: bool| tenants.gate(0, None, Some(0), |_| share_link);
        assert!(
            gate(&tenants, false).is_none(),
            "no device and no link in common"
        );
        assert!(
            matches!(gate(&tenants, true), Some(Verdict::HoldForPeers)),
            "a full link in common"
        );
        tenants
            .clock
            .set_devices(DeviceMask::Queued, 1, 1, 1 << 5 | 1 << 3);
        assert!(
            matches!(gate(&tenants, false), Some(Verdict::HoldForPeers)),
            "device 3 in common"
        );
        tenants.all[1].queued = 1;
        assert!(
            gate(&tenants, false).is_none(),
            "queued here: arbitrated here"
        );
    }
}
