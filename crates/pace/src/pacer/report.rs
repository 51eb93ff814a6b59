//! [`PacerStats`]: what a pacer reports of itself (RPC, metrics, the
//! simulator's tables).

use serde::{Deserialize, Serialize};

use super::{Mode, Pacer};
use crate::Nanos;

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
    /// auto: how many times its pipe-sized windows it lets in flight (see
    /// `depth`); 1 in the other modes.
    pub depth: f64,
    /// The factor the windows take now: a trial's step.
    #[serde(default)]
    pub depth_in_effect: f64,
    /// Devices whose windows keep depth 1 for a client that sends one IO
    /// at a time.
    #[serde(default)]
    pub held_devices: usize,
    /// The lowest device vrate (1.0: the cost model's rate, or no targets).
    pub vrate: f64,
    /// Each device's vrate.
    pub vrates: Vec<f64>,
    pub tenants: Vec<TenantStats>,
}

impl PacerStats {
    /// What pacer `p` reports of itself at `now`.
    pub(super) fn of(p: &Pacer, now: Nanos) -> PacerStats {
        let vtimes: Vec<f64> = (0..p.sched.tenants.len())
            .map(|t| p.sched.tenants.clock.vtime(t))
            .collect();
        let max_v = vtimes.iter().copied().fold(0.0, f64::max);
        let vrates: Vec<f64> = (0..p.sched.devices.len())
            .map(|d| p.gates.qos.as_ref().map_or(1.0, |q| q.vrate(d)))
            .collect();
        let total = p.released_total.max(1) as f64;
        let rate = p.windows.rate.get().unwrap_or(0.0);
        let period_us = match p.cfg.mode {
            Mode::Rate => p.rate_credit.period_ns() / 1000.0,
            Mode::Auto if rate > 0.0 => p.windows.max_io as f64 / rate * 1e6,
            _ => 0.0,
        };
        PacerStats {
            mode: p.cfg.mode,
            calls: p.calls,
            polls: p.polls,
            ios: p.ios,
            period_us,
            rate_bps: rate,
            window_bytes: if p.cfg.mode == Mode::Auto {
                p.windows.window
            } else {
                0
            },
            queued: p.queued(),
            queue_lengths: p.sched.devices.iter().map(|d| d.queue.len()).collect(),
            bytes_in_flight: p.bytes_in_flight,
            bytes_in_flight_avg: p.in_flight_avg.avg(now),
            bytes_in_flight_max: p.in_flight_avg.max(),
            min_latency_us: p.windows.latency.get().map_or(0.0, |l| l as f64 / 1e3),
            depth: if p.cfg.mode == Mode::Auto {
                p.windows.depth_now.learned
            } else {
                1.0
            },
            depth_in_effect: p.windows.depth_factor(&p.cfg),
            held_devices: p.sched.devices.iter().filter(|d| d.held).count(),
            // Of the devices with targets: a vrate above 1 (an underrated
            // cost model corrected) shows, where a fold from 1.0 hid it.
            vrate: (0..p.sched.devices.len())
                .filter(|&d| p.gates.qos.as_ref().is_some_and(|q| q.has_targets(d)))
                .map(|d| vrates[d])
                .reduce(f64::min)
                .unwrap_or(1.0),
            vrates,
            tenants: p
                .sched
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
