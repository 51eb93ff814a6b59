//! Windowed estimators: the max delivery rate over recent samples and the
//! min latency over a recent time span (the two halves of a BDP estimate),
//! and the spans every window (reactor, flow, device) samples them over.

use std::collections::VecDeque;

use crate::Nanos;

/// Rate samples are taken over this span of completions.
pub(super) const RATE_SAMPLE_NS: Nanos = 1_000_000;

/// Windowed max of the rate over this many samples (tracks link changes in ~50 ms).
const RATE_WINDOW: usize = 50;

/// A rate sample spans at least this many of the largest IOs.
pub(super) const RATE_SAMPLE_IOS: u64 = 16;

/// Every this many rate samples, one is taken with the window enlarged...
pub(super) const PROBE_EVERY: u64 = 8;

/// ...by this factor.
pub(super) const PROBE_GAIN: f64 = 1.25;
/// Each rate sample moves a flow's moving means (its hold time, where its
/// time went) by this part of the difference.
pub(super) const SAMPLE_WEIGHT: f64 = 0.25;

/// Min-latency window: how long an old minimum is trusted.
pub(super) const LATENCY_WINDOW_NS: Nanos = 200_000_000;

/// The delivered-rate estimator for a reactor, a flow or a device: the max
/// of recent samples of at least `RATE_SAMPLE_IOS` IOs of `max_io` (bytes,
/// or a device's time), over the last `RATE_WINDOW` sample spans.
pub(super) fn rate_filter(max_io: u64) -> WindowedMax {
    WindowedMax::new(RATE_WINDOW)
        .with_min_bytes(RATE_SAMPLE_IOS * max_io)
        .with_max_age(RATE_WINDOW as Nanos * RATE_SAMPLE_NS)
}

/// Max of the last `n` rate samples; a sample is bytes delivered over at
/// least `span` nanoseconds and at least `min_bytes`, and none is older than
/// `max_age` (the newest is always kept).
#[derive(Debug, Clone, Default)]
pub struct WindowedMax {
    n: usize,
    min_bytes: u64,
    /// A sample this long is taken whatever its bytes.
    max_span: Option<Nanos>,
    max_age: Option<Nanos>,
    /// (taken at, bytes per second)
    samples: VecDeque<(Nanos, f64)>,
    /// The max of `samples` (0 when empty), kept as each sample comes and
    /// goes: `get` runs several times per IO, the samples change once per
    /// sample span.
    max: f64,
    last_t: Option<Nanos>,
    last_bytes: u64,
}

impl WindowedMax {
    pub fn new(n: usize) -> WindowedMax {
        WindowedMax {
            n: n.max(1),
            ..Default::default()
        }
    }

    /// Samples hold at least `bytes`: the max of samples of a few IOs each
    /// is the luckiest burst, not the rate (a slow flow delivering two IOs
    /// in most milliseconds and five in one would read 2.5x its rate).
    pub fn with_min_bytes(mut self, bytes: u64) -> WindowedMax {
        self.set_min_bytes(bytes);
        self
    }

    /// As `with_min_bytes`, for samples from now on.
    pub fn set_min_bytes(&mut self, bytes: u64) {
        self.min_bytes = bytes;
    }

    /// A sample spanning `span` is taken however few bytes it holds: a
    /// slow flow is measured within `span`, not only after `min_bytes`.
    pub fn with_max_span(mut self, span: Nanos) -> WindowedMax {
        self.max_span = Some(span);
        self
    }

    /// Samples expire after `age`, so a floor of bytes per sample on a slow
    /// flow does not stretch how long an old rate is remembered.
    pub fn with_max_age(mut self, age: Nanos) -> WindowedMax {
        self.max_age = Some(age);
        self
    }

    /// Offers the cumulative byte count at `now`; true if a sample was taken.
    pub fn offer(&mut self, now: Nanos, cumulative: u64, span: Nanos) -> bool {
        let Some(t) = self.last_t else {
            self.last_t = Some(now);
            self.last_bytes = cumulative;
            return false;
        };
        debug_assert!(now >= t, "rate sampled back in time");
        debug_assert!(cumulative >= self.last_bytes, "cumulative bytes went down");
        let (dt, bytes) = (now - t, cumulative - self.last_bytes);
        let long = self.max_span.is_some_and(|m| dt >= m);
        if dt < span || (bytes < self.min_bytes && !long) || bytes == 0 {
            return false;
        }
        let rate = bytes as f64 * 1e9 / dt as f64;
        if self.n == 0 {
            self.n = 50;
        }
        if self.samples.len() == self.n {
            self.samples.pop_front();
        }
        self.samples.push_back((now, rate));
        if let Some(age) = self.max_age {
            while self.samples.len() > 1
                && self.samples.front().is_some_and(|&(t0, _)| t0 + age < now)
            {
                self.samples.pop_front();
            }
        }
        self.max = self.samples.iter().map(|&(_, r)| r).fold(0.0, f64::max);
        self.last_t = Some(now);
        self.last_bytes = cumulative;
        true
    }

    pub fn get(&self) -> Option<f64> {
        (self.max > 0.0).then_some(self.max)
    }
}

/// Min of values seen over the last one to two `span`s: the current epoch's
/// minimum and the previous epoch's, so an old minimum expires.
#[derive(Debug, Clone, Default)]
pub struct WindowedMin {
    span: Nanos,
    epoch_start: Nanos,
    current: Option<u64>,
    previous: Option<u64>,
}

impl WindowedMin {
    pub fn new(span: Nanos) -> WindowedMin {
        WindowedMin {
            span: span.max(1),
            ..Default::default()
        }
    }

    pub fn update(&mut self, value: u64, now: Nanos) {
        debug_assert!(now >= self.epoch_start, "minimum sampled back in time");
        if now - self.epoch_start >= self.span.max(1) {
            self.previous = self.current.take();
            self.epoch_start = now;
        }
        self.current = Some(self.current.map_or(value, |c| c.min(value)));
    }

    pub fn get(&self) -> Option<u64> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The min latency of the IOs that move the bytes: large IOs' when any have
/// completed recently, else small ones'. A window sized from a 4 KiB IO's
/// latency would be too small for the 128 KiB IOs beside it.
#[derive(Debug, Clone, Default)]
pub struct LargeIoMin {
    large: WindowedMin,
    small: WindowedMin,
}

impl LargeIoMin {
    pub fn new(span: Nanos) -> LargeIoMin {
        LargeIoMin {
            large: WindowedMin::new(span),
            small: WindowedMin::new(span),
        }
    }

    pub fn update(&mut self, value: u64, large: bool, now: Nanos) {
        if large {
            self.large.update(value, now);
        } else {
            self.small.update(value, now);
        }
    }

    pub fn get(&self) -> Option<u64> {
        self.large.get().or_else(|| self.small.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tracks_recent_samples() {
        let mut m = WindowedMax::new(3);
        assert!(!m.offer(0, 0, 1000));
        assert!(m.offer(1000, 100, 1000)); // 100 B/us
        assert!(!m.offer(1500, 1000, 1000)); // too soon
        assert!(m.offer(2000, 150, 1000));
        let mut few = WindowedMax::new(4).with_min_bytes(100);
        assert!(!few.offer(0, 0, 1000));
        assert!(!few.offer(1000, 50, 1000)); // too few bytes
        assert!(few.offer(3000, 150, 1000));
        assert_eq!(few.get(), Some(150.0 * 1e9 / 3000.0));
        let mut aging = WindowedMax::new(50).with_max_age(10_000);
        aging.offer(0, 0, 1000);
        aging.offer(1000, 1000, 1000); // 1e9 B/s
        aging.offer(20_000, 1100, 1000); // slower, and the first has expired
        assert_eq!(aging.get(), Some(100.0 * 1e9 / 19_000.0));
        assert_eq!(m.get(), Some(1e8));
        for i in 3..7 {
            m.offer(i * 1000, 150 + (i - 2) * 10, 1000);
        }
        // The 100 B/us sample aged out.
        assert!(m.get().is_some_and(|r| r < 1e8));
    }

    #[test]
    fn a_long_sample_is_taken_however_few_bytes() {
        let mut slow = WindowedMax::new(4)
            .with_min_bytes(1000)
            .with_max_span(10_000);
        assert!(!slow.offer(0, 0, 1000));
        assert!(!slow.offer(5_000, 100, 1000)); // too few bytes, too short
        assert!(slow.offer(10_000, 200, 1000)); // long enough
        assert_eq!(slow.get(), Some(200.0 * 1e9 / 10_000.0));
        assert!(
            !slow.offer(30_000, 200, 1000),
            "nothing delivered: no sample"
        );
        slow.set_min_bytes(50);
        assert!(slow.offer(31_000, 260, 1000));
    }

    #[test]
    fn min_expires_old_minimum() {
        let mut m = WindowedMin::new(100);
        m.update(10, 0);
        m.update(50, 50);
        assert_eq!(m.get(), Some(10));
        m.update(40, 150); // new epoch: 10 is still remembered for one more
        assert_eq!(m.get(), Some(10));
        m.update(45, 260); // and now it has expired
        assert_eq!(m.get(), Some(40));
    }

    #[test]
    fn large_io_latency_wins_over_small() {
        let mut m = LargeIoMin::new(1000);
        m.update(10, false, 0);
        assert_eq!(m.get(), Some(10));
        m.update(70, true, 1);
        assert_eq!(m.get(), Some(70));
    }
}
