//! Statistics primitives shared by the target and the simulator.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::Nanos;
pub use types::StatState;

/// Time-weighted average of a gauge (e.g. buffers in flight), with time injected.
#[derive(Debug, Clone)]
pub struct TimeAvg {
    start: Nanos,
    last: Nanos,
    value: u64,
    max: u64,
    /// Sum of value x duration, in value-nanoseconds.
    area: u128,
}

impl TimeAvg {
    pub fn new(now: Nanos) -> TimeAvg {
        TimeAvg {
            start: now,
            last: now,
            value: 0,
            max: 0,
            area: 0,
        }
    }

    /// The gauge becomes `value` at `now`.
    pub fn update(&mut self, now: Nanos, value: u64) {
        let now = now.max(self.last);
        self.area += u128::from(self.value) * u128::from(now - self.last);
        self.last = now;
        self.value = value;
        self.max = self.max.max(value);
    }

    pub fn current(&self) -> u64 {
        self.value
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Average since the start (or last reset) up to `now`.
    pub fn avg(&self, now: Nanos) -> f64 {
        let now = now.max(self.last);
        let span = now - self.start;
        if span == 0 {
            return self.value as f64;
        }
        let area = self.area + u128::from(self.value) * u128::from(now - self.last);
        area as f64 / span as f64
    }

    /// Starts a new averaging interval at `now`, keeping the current value.
    pub fn reset(&mut self, now: Nanos) {
        self.update(now, self.value);
        self.start = now;
        self.area = 0;
        self.max = self.value;
    }
}

/// Latency histogram in nanoseconds (3 significant figures).
#[derive(Debug, Clone)]
pub struct LatencyHist {
    h: Histogram<u64>,
}

impl Default for LatencyHist {
    fn default() -> Self {
        Self::new()
    }
}

/// A latency histogram's summary, as stats reports carry it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl LatencyHist {
    pub fn new() -> LatencyHist {
        // Auto-resizing, so any latency is recordable; 3 digits is hdr's usual precision.
        let mut h = Histogram::new(3).expect("3 significant figures is a valid precision");
        h.auto(true);
        LatencyHist { h }
    }

    pub fn record(&mut self, ns: u64) {
        // Saturating: with auto-resize this only fails on u64::MAX overflow.
        let _ = self.h.record(ns.max(1));
    }

    pub fn count(&self) -> u64 {
        self.h.len()
    }

    pub fn mean(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.h.mean()
        }
    }

    /// Value at percentile `p` (0..=100), 0 when empty.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.h.is_empty() {
            0
        } else {
            self.h.value_at_quantile((p / 100.0).clamp(0.0, 1.0))
        }
    }

    /// IOs recorded at or below `ns` (to hdr's precision), for histogram buckets.
    pub fn count_at_or_below(&self, ns: u64) -> u64 {
        self.h.count_between(0, ns)
    }

    pub fn merge(&mut self, other: &LatencyHist) {
        let _ = self.h.add(&other.h);
    }

    pub fn reset(&mut self) {
        self.h.reset();
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.count(),
            mean_us: self.mean() / 1e3,
            p50_us: self.percentile(50.0) as f64 / 1e3,
            p99_us: self.percentile(99.0) as f64 / 1e3,
            p999_us: self.percentile(99.9) as f64 / 1e3,
            max_us: if self.h.is_empty() {
                0.0
            } else {
                self.h.max() as f64 / 1e3
            },
        }
    }
}

/// Number of requests in each state. DONE counts completed requests.
#[derive(Debug, Clone, Default)]
pub struct StateCounts {
    counts: [u64; 6],
}

impl StateCounts {
    pub fn enter(&mut self, s: StatState) {
        self.counts[s.index()] += 1;
    }

    /// Leaving DONE is never recorded: DONE is a running total.
    pub fn leave(&mut self, s: StatState) {
        if s != StatState::Done {
            let c = &mut self.counts[s.index()];
            debug_assert!(*c > 0, "leaving {} with none in it", s.name());
            *c -= 1;
        }
    }

    pub fn transition(&mut self, from: StatState, to: StatState) {
        self.leave(from);
        self.enter(to);
    }

    pub fn get(&self, s: StatState) -> u64 {
        self.counts[s.index()]
    }

    /// Requests not yet done.
    pub fn in_flight(&self) -> u64 {
        StatState::ALL[..5].iter().map(|s| self.get(*s)).sum()
    }
}

impl Serialize for StateCounts {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = ser.serialize_map(Some(6))?;
        for s in StatState::ALL {
            m.serialize_entry(s.name(), &self.get(s))?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_avg_weights_by_duration() {
        let mut g = TimeAvg::new(0);
        g.update(0, 10);
        g.update(100, 20);
        // 10 for 100 ns, 20 for 300 ns.
        assert!((g.avg(400) - 17.5).abs() < 1e-9);
        assert_eq!(g.max(), 20);
        g.reset(400);
        assert!((g.avg(500) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn latency_percentiles() {
        let mut h = LatencyHist::new();
        for i in 1..=1000u64 {
            h.record(i * 1000);
        }
        assert_eq!(h.count(), 1000);
        let p99 = h.percentile(99.0);
        assert!((989_000..=991_000).contains(&p99), "{p99}");
        let s = h.summary();
        assert!((s.mean_us - 500.5).abs() < 1.0);
        assert_eq!(LatencyHist::new().percentile(99.0), 0);
    }

    #[test]
    fn state_counts_track_in_flight() {
        let mut c = StateCounts::default();
        c.enter(StatState::New);
        c.transition(StatState::New, StatState::Executing);
        c.enter(StatState::New);
        assert_eq!(c.in_flight(), 2);
        c.transition(StatState::Executing, StatState::Done);
        assert_eq!(c.in_flight(), 1);
        assert_eq!(c.get(StatState::Done), 1);
        let json = serde_json_like(&c);
        assert!(json.contains("NEED_BUFFER"));
    }

    fn serde_json_like(c: &StateCounts) -> String {
        // Avoids a serde_json dev-dependency: Debug of the names is enough here.
        StatState::ALL
            .iter()
            .map(|s| format!("{}={}", s.name(), c.get(*s)))
            .collect()
    }
}
