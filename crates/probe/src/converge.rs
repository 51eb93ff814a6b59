//! When a measurement point has run long enough: its per-window rates have
//! a 95% confidence interval within ±`ci` of their mean, or time is up.

use std::time::Duration;

/// How long a point runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopRule {
    /// One rate sample per window.
    pub window: Duration,
    /// Discarded at the start: the queue fills and caches settle.
    pub warmup: Duration,
    /// Samples needed before the interval is trusted.
    pub min_windows: usize,
    /// Relative half-width of the 95% interval that counts as converged.
    pub ci: f64,
    /// Longest a point may run (after warm-up).
    pub cap: Duration,
}

impl StopRule {
    /// Real devices: 100 ms windows, ±3%, at most 4 s a point.
    pub fn device() -> StopRule {
        StopRule {
            window: Duration::from_millis(100),
            warmup: Duration::from_millis(200),
            min_windows: 8,
            ci: 0.03,
            cap: Duration::from_secs(4),
        }
    }

    /// Quick runs (tests, model devices): 20 ms windows, at most 0.4 s.
    pub fn quick() -> StopRule {
        StopRule {
            window: Duration::from_millis(20),
            warmup: Duration::from_millis(20),
            min_windows: 6,
            ci: 0.03,
            cap: Duration::from_millis(400),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Converged,
    /// Time is up before the interval narrowed.
    Capped,
}

/// Student's t, two-sided 95%, for `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        31..=60 => 2.00,
        _ => 1.96,
    }
}

/// Mean of `samples` and the half-width of its 95% confidence interval,
/// relative to the mean (infinite with fewer than two samples or a zero mean).
pub fn mean_and_rel_ci(samples: &[f64]) -> (f64, f64) {
    let n = samples.len();
    if n == 0 {
        return (0.0, f64::INFINITY);
    }
    let mean = samples.iter().sum::<f64>() / n as f64;
    if n < 2 || mean <= 0.0 {
        return (mean, f64::INFINITY);
    }
    let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t95(n - 1) * (var / n as f64).sqrt();
    (mean, half / mean)
}

/// The median of `samples` (0 for none).
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Whether a point with these window samples, `elapsed` after warm-up, stops.
pub fn verdict(samples: &[f64], elapsed: Duration, rule: &StopRule) -> Verdict {
    if samples.len() >= rule.min_windows && mean_and_rel_ci(samples).1 <= rule.ci {
        Verdict::Converged
    } else if elapsed >= rule.cap {
        Verdict::Capped
    } else {
        Verdict::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_samples_converge_noisy_ones_do_not() {
        let rule = StopRule::quick();
        let steady = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0];
        assert_eq!(verdict(&steady, Duration::ZERO, &rule), Verdict::Converged);
        let noisy = [50.0, 150.0, 80.0, 120.0, 60.0, 140.0];
        assert_eq!(verdict(&noisy, Duration::ZERO, &rule), Verdict::Continue);
        assert_eq!(verdict(&noisy, rule.cap, &rule), Verdict::Capped);
        // Too few samples never converge, however steady.
        assert_eq!(
            verdict(&steady[..3], Duration::ZERO, &rule),
            Verdict::Continue
        );
    }

    #[test]
    fn interval_matches_hand_computation() {
        // mean 10, sample sd 1.5811, n 5: half = 2.776 * 1.5811 / sqrt(5) = 1.963
        let (mean, rel) = mean_and_rel_ci(&[8.0, 9.0, 10.0, 11.0, 12.0]);
        assert_eq!(mean, 10.0);
        assert!((rel - 0.1963).abs() < 1e-3, "{rel}");
        assert!(mean_and_rel_ci(&[5.0]).1.is_infinite());
        assert!(mean_and_rel_ci(&[]).1.is_infinite());
    }
}
