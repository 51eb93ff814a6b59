//! Tenants: each release opportunity goes to the queued tenant with the
//! least virtual time (weighted fair queuing over IO cost, see
//! [`TenantClock`](super::TenantClock)), and a tenant running too far ahead
//! of one busy on another reactor waits for it.

use std::collections::VecDeque;

use super::ablate::{self, Mechanism};
use super::{Pacer, TenantConfig, Verdict};
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
}

impl Tenant {
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

impl Pacer {
    /// Whether tenant `t` waits for other tenants before its devices are
    /// looked at (None: it need not).
    pub(super) fn tenant_gate(&self, t: usize, link_waiter: Option<f64>) -> Option<Verdict> {
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

    /// Tenant `t` has one IO here and nothing in flight (a QD 1 client): it
    /// goes past full windows and device budgets, so a light tenant's IO never waits for a heavy
    /// tenant's to complete. This adds at most one IO per light tenant.
    pub(super) fn light(&self, t: usize) -> bool {
        let tenant = &self.tenants[t];
        tenant.in_flight == 0
            && tenant.queued <= 1
            && self.tenants.len() > 1
            && !ablate::out(Mechanism::Light)
    }

    /// The queued tenant with the least virtual time (weighted fair queuing).
    pub(super) fn pick_tenant(&self, skipped: &[bool]) -> Option<usize> {
        self.tenants
            .iter()
            .enumerate()
            .filter(|(i, t)| t.queued > 0 && !t.active.is_empty() && !skipped[*i])
            .map(|(i, _)| i)
            .min_by(|&a, &b| self.clock.vtime(a).total_cmp(&self.clock.vtime(b)))
    }

    /// Publishes when each tenant's oldest IO queued here arrived, for the
    /// reactors' shared tenant clock. Only with tenants on pooled reactors.
    pub(super) fn publish_oldest(&self) {
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
}
