//! Latency targets, as iocost has them: each device with a target gets a
//! budget of device time (the cost model's nanoseconds) that grows at
//! `vrate` x wall time. Every period the share of completions over the
//! read/write latency targets decides whether `vrate` falls (targets missed),
//! rises (targets met while IO waited for budget) or stays.
//!
//! One [`DeviceQos`] is shared by every reactor's pacer, so the budget and
//! the latency counts are the device's, not a reactor's.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::IoKind;
use crate::Nanos;

/// `[qos.BDEV]` in the target's config, `qos` on a simulated device group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosConfig {
    /// Read latency percentile that must stay under `rlat_us` (0: no read target).
    #[serde(default)]
    pub rpct: f64,
    #[serde(default)]
    pub rlat_us: f64,
    /// Write latency percentile that must stay under `wlat_us` (0: no write target).
    #[serde(default)]
    pub wpct: f64,
    #[serde(default)]
    pub wlat_us: f64,
    /// Lowest vrate, percent of the cost model's rate. vrate starts at
    /// 100% clamped to `min..=max`, so bounds both below (or both above)
    /// 100 hold it there; `min` = `max` holds it fixed, and needs no
    /// latency target.
    #[serde(default = "default_min")]
    pub min: f64,
    /// Highest vrate, percent (at least `min`).
    #[serde(default = "default_max")]
    pub max: f64,
    /// How often vrate is adjusted (default: 16x the larger target, 1-100 ms).
    #[serde(default)]
    pub period_ms: Option<f64>,
    /// While a light (QD 1) tenant is about, other tenants' IOs at the
    /// device (every reactor's) are held to this many (see
    /// [`DeviceGate`](super::DeviceGate)): a cap, not a rate, so it costs
    /// the device only the rate its curve loses at this depth. Needs no
    /// latency target or vrate.
    #[serde(default)]
    pub light_depth: Option<u32>,
}

/// The largest `light_depth`: past a few hundred IOs no device queue is
/// shorter for it.
pub const MAX_LIGHT_DEPTH: u32 = 4096;

fn default_min() -> f64 {
    1.0
}
fn default_max() -> f64 {
    10_000.0
}

impl QosConfig {
    /// Checks values; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, pct, lat_field, lat) in [
            ("rpct", self.rpct, "rlat_us", self.rlat_us),
            ("wpct", self.wpct, "wlat_us", self.wlat_us),
        ] {
            if !(0.0..=100.0).contains(&pct) {
                return Err((field, "must be a percentile between 0 and 100".into()));
            }
            if pct > 0.0 && !(lat > 0.0 && lat.is_finite()) {
                return Err((lat_field, format!("{field} > 0 needs a latency > 0")));
            }
        }
        if !(self.min > 0.0 && self.min.is_finite()) {
            return Err(("min", "must be a percentage above 0".into()));
        }
        if !(self.max >= self.min && self.max.is_finite()) {
            return Err(("max", format!("must be at least min ({})", self.min)));
        }
        if let Some(n) = self.light_depth {
            if !(1..=MAX_LIGHT_DEPTH).contains(&n) {
                return Err((
                    "light_depth",
                    format!("must be between 1 and {MAX_LIGHT_DEPTH} IOs"),
                ));
            }
        }
        let bounds_set = self.min != default_min() || self.max != default_max();
        if !self.budget() && self.light_depth.is_some() && bounds_set {
            return Err((
                "min",
                "min and max need rpct/rlat_us or wpct/wlat_us, or min = max".into(),
            ));
        }
        if !self.budget() && self.light_depth.is_none() {
            return Err((
                "rpct",
                "set rpct and rlat_us, or wpct and wlat_us (or min = max to hold vrate there)"
                    .into(),
            ));
        }
        if let Some(p) = self.period_ms {
            if !(p > 0.0 && p <= 10_000.0) {
                return Err(("period_ms", "must be in (0, 10000] ms".into()));
            }
        }
        Ok(())
    }

    /// It sets a budget: a latency target, or a vrate held (`min` = `max`).
    /// A `[qos]` with only `light_depth` sets none.
    pub fn budget(&self) -> bool {
        self.rpct > 0.0 || self.wpct > 0.0 || self.min == self.max
    }

    fn period_ns(&self) -> Nanos {
        match self.period_ms {
            Some(ms) => (ms * 1e6) as Nanos,
            None => {
                let lat = self.rlat_us.max(self.wlat_us);
                ((16.0 * lat * 1e3) as Nanos).clamp(1_000_000, 100_000_000)
            }
        }
    }
}

/// Device time a device may bank while idle, ns: about one large IO, so an
/// idle spell does not turn into a burst that queues at the device.
const BURST_NS: f64 = 100_000.0;

/// The budget (cost-model ns) a device may bank while idle at `vrate`:
/// [`BURST_NS`], or more above vrate 1. There vrate corrects a cost model
/// that underrates the device, and a bank fixed in model time would shrink
/// in real time as 1/vrate: at vrate 2, 50 us, under one poll of a busy
/// reactor, which then lost ~18% of its budget on this machine's disk.
/// Above 1 the bank is 100 us of wall time at vrate. `iopace tune`'s
/// throttle banks the same, so it measures the budget the server applies.
pub fn burst_ns(vrate: f64) -> f64 {
    debug_assert!(vrate > 0.0, "vrate {vrate}");
    BURST_NS * vrate.max(1.0)
}
/// The most vrate rises in one period.
const MAX_RISE: f64 = 0.02;
/// A period with fewer completions (and no IO waiting for budget) is
/// extended: a percentile of a handful of IOs is noise.
const MIN_SAMPLES: u64 = 32;

#[derive(Debug)]
struct State {
    cfg: QosConfig,
    period: Nanos,
    /// vrate as a fraction (1.0 = the cost model's rate).
    vrate: f64,
    /// Device time granted up to `at`.
    vnow: f64,
    at: Nanos,
    /// Device time taken by issued IOs.
    used: f64,
    period_start: Nanos,
    /// Completions and misses this period: reads, writes.
    done: [u64; 2],
    missed: [u64; 2],
    /// IO waited for budget this period.
    shortage: bool,
    /// Consecutive periods over (positive) or under (negative) target.
    busy_level: i32,
}

impl State {
    fn advance(&mut self, now: Nanos) {
        if now > self.at {
            self.vnow += (now - self.at) as f64 * self.vrate;
            self.at = now;
        }
        self.used = self.used.max(self.vnow - burst_ns(self.vrate));
    }

    fn adjust(&mut self, now: Nanos) {
        // Reactors share this state under a lock, each with its own clock
        // reading: another's `now` may be a little ahead of ours.
        if now.saturating_sub(self.period_start) < self.period {
            return;
        }
        let samples = self.done[0] + self.done[1];
        if samples < MIN_SAMPLES && !self.shortage {
            return;
        }
        let over = |done: u64, missed: u64, pct: f64| {
            pct > 0.0 && done > 0 && missed as f64 > done as f64 * (1.0 - pct / 100.0)
        };
        let missed = over(self.done[0], self.missed[0], self.cfg.rpct)
            || over(self.done[1], self.missed[1], self.cfg.wpct);
        self.advance(now);
        if missed {
            self.busy_level = self.busy_level.max(0) + 1;
            self.vrate *= 1.0 - step(self.busy_level);
        } else if self.shortage {
            // Rising is slow and falling fast: past the device's capacity
            // a queue builds that takes periods to drain.
            self.busy_level = self.busy_level.min(0) - 1;
            self.vrate *= 1.0 + step(self.busy_level).min(MAX_RISE);
        } else {
            self.busy_level = 0;
        }
        self.vrate = self.vrate.clamp(self.cfg.min / 100.0, self.cfg.max / 100.0);
        self.period_start = now;
        self.done = [0; 2];
        self.missed = [0; 2];
        self.shortage = false;
    }
}

/// The vrate step after `level` periods in a row the same way: 1% at
/// first, doubling every two periods up to 16% (rises stop at
/// [`MAX_RISE`]), so a far-off vrate is found in tens of periods and a near
/// one is not overshot.
fn step(level: i32) -> f64 {
    let n = (level.unsigned_abs().max(1) - 1) / 2;
    f64::from(1u32 << n.min(4)) / 100.0
}

/// Latency-target state of every device, shared by all reactors' pacers.
#[derive(Debug)]
pub struct DeviceQos {
    devices: Vec<Option<Mutex<State>>>,
}

impl DeviceQos {
    /// One entry per pacer device; `None` for devices without targets.
    /// A `[qos]` that sets no budget (only `light_depth`) gets none here.
    pub fn new(targets: &[Option<QosConfig>], now: Nanos) -> Arc<DeviceQos> {
        let devices = targets
            .iter()
            .map(|t| {
                t.filter(QosConfig::budget).map(|cfg| {
                    Mutex::new(State {
                        cfg,
                        period: cfg.period_ns(),
                        vrate: 1.0f64.clamp(cfg.min / 100.0, cfg.max / 100.0),
                        vnow: 0.0,
                        at: now,
                        used: 0.0,
                        period_start: now,
                        done: [0; 2],
                        missed: [0; 2],
                        shortage: false,
                        busy_level: 0,
                    })
                })
            })
            .collect();
        Arc::new(DeviceQos { devices })
    }

    fn with<R>(&self, device: usize, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        let m = self.devices.get(device)?.as_ref()?;
        // A poisoned lock only means another reactor panicked mid-update;
        // the numbers are still usable.
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        Some(f(&mut s))
    }

    /// When device `device` has budget for another IO: `now` if it has it,
    /// the time it will otherwise. Devices without targets always have it.
    pub fn ready_at(&self, device: usize, now: Nanos) -> Nanos {
        self.with(device, |s| {
            s.advance(now);
            if s.used <= s.vnow {
                now
            } else {
                s.shortage = true;
                now + ((s.used - s.vnow) / s.vrate).ceil() as Nanos
            }
        })
        .unwrap_or(now)
    }

    /// Takes `cost` ns of device time for an issued IO.
    pub fn charge(&self, device: usize, cost: f64, now: Nanos) {
        self.with(device, |s| {
            s.advance(now);
            s.used += cost;
        });
    }

    /// An IO finished after `latency_ns` at the device.
    pub fn record(&self, device: usize, kind: IoKind, latency_ns: u64, now: Nanos) {
        self.with(device, |s| {
            let (i, target_us) = match kind {
                IoKind::Read => (0, s.cfg.rlat_us),
                IoKind::Write => (1, s.cfg.wlat_us),
            };
            s.done[i] += 1;
            if target_us > 0.0 && latency_ns as f64 > target_us * 1e3 {
                s.missed[i] += 1;
            }
            s.adjust(now);
        });
    }

    /// Device `device`'s vrate (1.0 = the cost model's rate; 1.0 without targets).
    pub fn vrate(&self, device: usize) -> f64 {
        self.with(device, |s| s.vrate).unwrap_or(1.0)
    }

    pub fn has_targets(&self, device: usize) -> bool {
        self.devices.get(device).is_some_and(|d| d.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(rlat_us: f64) -> QosConfig {
        QosConfig {
            rpct: 90.0,
            rlat_us,
            wpct: 0.0,
            wlat_us: 0.0,
            min: 10.0,
            max: 200.0,
            period_ms: Some(1.0),
            light_depth: None,
        }
    }

    /// Records `n` reads of `latency` ns, one every `gap` ns; returns the time after.
    fn reads(q: &DeviceQos, mut now: Nanos, n: u64, gap: Nanos, latency: u64) -> Nanos {
        for _ in 0..n {
            now += gap;
            q.record(0, IoKind::Read, latency, now);
        }
        now
    }

    #[test]
    fn budget_paces_issue_at_vrate() {
        let q = DeviceQos::new(&[Some(target(100.0)), None], 0);
        assert_eq!(q.ready_at(0, 0), 0);
        q.charge(0, 250_000.0, 0);
        // 250 us of device time at vrate 1 is ready 250 us later, less the burst.
        assert_eq!(q.ready_at(0, 0), 250_000);
        assert_eq!(q.ready_at(0, 250_000), 250_000);
        // Devices without targets are never held.
        q.charge(1, 1e12, 0);
        assert_eq!(q.ready_at(1, 5), 5);
    }

    /// Releases 4 KiB random reads (11 us of device time each, this
    /// machine's disk) whenever device 0's budget allows, for `secs`
    /// simulated seconds at vrate `vrate`, each wake `late` ns after the
    /// time `ready_at` named. Returns (IOs released, wakes, delivered
    /// device time / wall time).
    fn saturate(vrate: f64, secs: f64, late: Nanos) -> (u64, u64, f64) {
        const COST: f64 = 11_000.0;
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        q.with(0, |s| s.vrate = vrate);
        let end = (secs * 1e9) as Nanos;
        let (mut now, mut released, mut wakes) = (0, 0u64, 0u64);
        while now < end {
            let at = q.ready_at(0, now);
            if at > now {
                wakes += 1;
                now = at + late;
                continue;
            }
            q.charge(0, COST, now);
            released += 1;
        }
        (released, wakes, released as f64 * COST / now as f64)
    }

    #[test]
    fn a_saturated_budget_delivers_vrate_and_keeps_late_wakes_banked() {
        for vrate in [0.3, 1.0, 2.0] {
            // One wake per IO (batching them was measured not to cut the
            // reactor's CPU, docs/evidence.md#tune-budget-cpu).
            let (released, wakes, rate) = saturate(vrate, 1.0, 0);
            assert!(
                released.abs_diff(wakes) <= 1,
                "{released} IOs, {wakes} wakes"
            );
            assert!((rate / vrate - 1.0).abs() < 0.01, "vrate {vrate}: {rate}");
            // Wakes late by less than the bank lose nothing.
            let (_, _, rate) = saturate(vrate, 1.0, 40_000);
            assert!((rate / vrate - 1.0).abs() < 0.01, "vrate {vrate}: {rate}");
        }
        // Later than the bank holds, the rest is lost.
        let (_, _, rate) = saturate(1.0, 1.0, 200_000);
        assert!(rate < 0.9, "delivered {rate}");
    }

    #[test]
    fn idle_time_banks_at_most_the_burst() {
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        q.charge(0, 10.0, 1_000_000_000);
        q.charge(0, BURST_NS, 1_000_000_000);
        assert!(q.ready_at(0, 1_000_000_000) > 1_000_000_000);
    }

    #[test]
    fn above_vrate_1_the_bank_is_the_burst_in_wall_time() {
        assert_eq!(burst_ns(0.4), BURST_NS);
        assert_eq!(burst_ns(1.0), BURST_NS);
        assert_eq!(burst_ns(2.0), 2.0 * BURST_NS);
        // At vrate 2 an idle second banks 200 us of model time (100 us of
        // wall time at vrate), not 100.
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        q.with(0, |s| s.vrate = 2.0);
        let t = 1_000_000_000;
        q.charge(0, 1.5 * BURST_NS, t);
        assert_eq!(q.ready_at(0, t), t);
        q.charge(0, BURST_NS, t);
        assert!(q.ready_at(0, t) > t);
    }

    #[test]
    fn missed_targets_lower_vrate_and_met_ones_with_demand_raise_it() {
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        let mut now = 0;
        for _ in 0..20 {
            now = reads(&q, now, MIN_SAMPLES, 40_000, 300_000);
        }
        let low = q.vrate(0);
        assert!(low < 0.9, "vrate {low}");
        for _ in 0..20 {
            q.charge(0, 1e9, now);
            assert!(q.ready_at(0, now) > now);
            now = reads(&q, now, MIN_SAMPLES, 40_000, 50_000);
        }
        assert!(q.vrate(0) > low, "vrate {} after {low}", q.vrate(0));
        // Met targets without demand leave vrate alone.
        let v = q.vrate(0);
        reads(&q, now, MIN_SAMPLES * 4, 100_000, 50_000);
        assert!((q.vrate(0) - v).abs() < 1e-9);
    }

    #[test]
    fn an_underrated_device_is_corrected_up_to_max() {
        // The cost model says half of what the device does: IO always
        // waits for budget and the latency target is met, so vrate climbs
        // (at most 2% a period) to max and holds there.
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        let mut now = 0;
        for _ in 0..60 {
            q.charge(0, 1e9, now);
            assert!(q.ready_at(0, now) > now);
            now = reads(&q, now, MIN_SAMPLES, 40_000, 50_000);
        }
        assert!((q.vrate(0) - 2.0).abs() < 1e-9, "vrate {}", q.vrate(0));
    }

    #[test]
    fn vrate_stays_within_min_and_max() {
        let q = DeviceQos::new(&[Some(target(100.0))], 0);
        reads(&q, 0, 500 * MIN_SAMPLES, 40_000, 900_000);
        assert!((q.vrate(0) - 0.10).abs() < 1e-9);
    }

    #[test]
    fn validate_names_the_field() {
        let mut c = target(100.0);
        assert!(c.validate().is_ok());
        c.rlat_us = 0.0;
        assert_eq!(c.validate().map_err(|e| e.0), Err("rlat_us"));
        c = target(100.0);
        c.min = 0.0;
        assert_eq!(c.validate().map_err(|e| e.0), Err("min"));
        c = target(100.0);
        c.rpct = 0.0;
        assert_eq!(c.validate().map_err(|e| e.0), Err("rpct"));
        c = target(100.0);
        (c.min, c.max) = (50.0, 40.0);
        assert_eq!(c.validate().map_err(|e| e.0), Err("max"));
        c.max = f64::INFINITY;
        assert_eq!(c.validate().map_err(|e| e.0), Err("max"));
    }

    #[test]
    fn a_light_depth_alone_is_valid_and_sets_no_budget() {
        let only = QosConfig {
            rpct: 0.0,
            rlat_us: 0.0,
            wpct: 0.0,
            wlat_us: 0.0,
            min: default_min(),
            max: default_max(),
            period_ms: None,
            light_depth: Some(16),
        };
        assert!(only.validate().is_ok() && !only.budget());
        let q = DeviceQos::new(&[Some(only)], 0);
        assert!(!q.has_targets(0), "no budget to wait for");
        for n in [0, MAX_LIGHT_DEPTH + 1] {
            let c = QosConfig {
                light_depth: Some(n),
                ..only
            };
            assert_eq!(c.validate().map_err(|e| e.0), Err("light_depth"));
        }
        // Bounds with neither a target nor min = max mean nothing.
        let c = QosConfig { min: 20.0, ..only };
        assert_eq!(c.validate().map_err(|e| e.0), Err("min"));
        // Beside a held vrate it is valid too, and the budget stays.
        let c = QosConfig {
            min: 50.0,
            max: 50.0,
            ..only
        };
        assert!(c.validate().is_ok() && DeviceQos::new(&[Some(c)], 0).has_targets(0));
    }

    #[test]
    fn bounds_on_either_side_of_100_hold_vrate_there() {
        // Both below 100: vrate starts at max and no met target lifts it.
        let mut c = target(100.0);
        (c.min, c.max) = (20.0, 40.0);
        assert!(c.validate().is_ok());
        let q = DeviceQos::new(&[Some(c)], 0);
        assert!((q.vrate(0) - 0.4).abs() < 1e-12);
        let mut now = 0;
        for _ in 0..20 {
            q.charge(0, 1e9, now);
            assert!(q.ready_at(0, now) > now);
            now = reads(&q, now, MIN_SAMPLES, 40_000, 50_000);
        }
        assert!((q.vrate(0) - 0.4).abs() < 1e-12, "vrate {}", q.vrate(0));
        // min = max holds vrate fixed, with no latency target at all.
        let fixed = QosConfig {
            rpct: 0.0,
            rlat_us: 0.0,
            min: 30.0,
            max: 30.0,
            period_ms: None,
            light_depth: None,
            ..c
        };
        assert!(fixed.validate().is_ok());
        let q = DeviceQos::new(&[Some(fixed)], 0);
        reads(&q, 0, 100 * MIN_SAMPLES, 40_000, 900_000);
        assert!((q.vrate(0) - 0.3).abs() < 1e-12, "vrate {}", q.vrate(0));
    }
}
