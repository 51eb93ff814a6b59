//! `rate` mode: a byte credit every `period`, kept up to `burst` periods
//! (late polls lose nothing up to that), and the `io-rate` /
//! `bytes-in-flight` tuners that lengthen the period.

use super::{PacingConfig, Tuner};
use crate::Nanos;

/// The tuners look again after this long.
const TUNE_EVERY_NS: Nanos = 1_000_000;
/// `bytes-in-flight`'s target when none is configured.
const DEFAULT_TARGET_IN_FLIGHT: u64 = 4 << 20;
/// `bytes-in-flight` moves the period by this many ns at a time.
const TUNE_STEP_NS: f64 = 1000.0;
/// `io-rate` sets the period this much under the measured IO period.
const IO_RATE_MARGIN_NS: f64 = 1000.0;

#[derive(Debug, Clone)]
pub(super) struct RateCredit {
    /// The period in effect (the tuners move it within [P, 2P]).
    period_ns: f64,
    /// Bytes of credit per period.
    per_period: f64,
    /// Bytes that may be released now; negative after a large IO.
    credit: f64,
    last_refill: Nanos,
    tuned_at: Nanos,
    completions_since_tune: u64,
}

impl RateCredit {
    /// Full credit; `buffer_size` is the credit per period unless one is
    /// configured.
    pub fn new(cfg: &PacingConfig, buffer_size: u32, now: Nanos) -> RateCredit {
        let per_period = cfg.credit.unwrap_or(u64::from(buffer_size)) as f64;
        RateCredit {
            period_ns: cfg.period_ns(),
            per_period,
            credit: per_period,
            last_refill: now,
            tuned_at: now,
            completions_since_tune: 0,
        }
    }

    /// New settings: full credit again, the tuners' measurements kept.
    pub fn reconfigure(&mut self, cfg: &PacingConfig, now: Nanos) {
        self.period_ns = cfg.period_ns();
        if let Some(c) = cfg.credit {
            self.per_period = c as f64;
        }
        self.credit = self.per_period;
        self.last_refill = now;
    }

    /// Credit earned since the last refill, up to `burst` periods of it.
    pub fn refill(&mut self, cfg: &PacingConfig, now: Nanos) {
        debug_assert!(now >= self.last_refill, "the clock went back");
        let elapsed = (now - self.last_refill) as f64;
        self.last_refill = now;
        let cap = self.per_period * cfg.burst;
        self.credit = (self.credit + elapsed * self.per_ns()).min(cap);
    }

    fn per_ns(&self) -> f64 {
        self.per_period / self.period_ns.max(1.0)
    }

    pub fn has_credit(&self) -> bool {
        self.credit > 0.0
    }

    pub fn spend(&mut self, bytes: u64) {
        self.credit -= bytes as f64;
    }

    /// One IO completed (the `io-rate` tuner's sample).
    pub fn completed(&mut self) {
        self.completions_since_tune += 1;
    }

    /// When credit is next there, if there is none now.
    pub fn credit_at(&self, now: Nanos) -> Option<Nanos> {
        if self.has_credit() {
            return None;
        }
        let wait = ((-self.credit + 1.0) / self.per_ns().max(1e-12)).ceil() as u64;
        Some(now + wait.max(1_000))
    }

    pub fn period_ns(&self) -> f64 {
        self.period_ns
    }

    /// The tuners, once per `TUNE_EVERY_NS`; `bytes_in_flight` is the
    /// reactor's.
    pub fn tune(&mut self, cfg: &PacingConfig, bytes_in_flight: u64, now: Nanos) {
        let Some(tuner) = cfg.tuner else { return };
        let base = cfg.period_ns();
        debug_assert!(now >= self.tuned_at, "the clock went back");
        let elapsed = now - self.tuned_at;
        if elapsed < TUNE_EVERY_NS {
            return;
        }
        match tuner {
            Tuner::IoRate => {
                // The measured IO period minus a margin, bounded [P, 2P].
                if self.completions_since_tune > 0 {
                    let measured = elapsed as f64 / self.completions_since_tune as f64;
                    self.period_ns = (measured - IO_RATE_MARGIN_NS).clamp(base, 2.0 * base);
                }
            }
            Tuner::BytesInFlight => {
                // Lengthen the period while bytes in flight exceed the target.
                let target = cfg.target_in_flight.unwrap_or(DEFAULT_TARGET_IN_FLIGHT);
                self.period_ns = if bytes_in_flight > target {
                    (self.period_ns + TUNE_STEP_NS).min(2.0 * base)
                } else {
                    (self.period_ns - TUNE_STEP_NS).max(base)
                };
            }
        }
        self.tuned_at = now;
        self.completions_since_tune = 0;
    }
}
