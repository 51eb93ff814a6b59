//! Bounds on every numeric setting: a value outside them is a config (or RPC)
//! error, never an allocation failure, a thread storm or a stalled pacer.

use pace::pacer::{CostModel, PacingConfig};

/// Most reactor threads: far beyond any core count this target is built for,
/// well below what exhausts threads or io_uring memory.
pub const MAX_REACTORS: usize = 256;

/// Most request slots per reactor; slots are preallocated.
pub const MAX_REQUESTS_PER_REACTOR: u32 = 65_536;

/// Longest shutdown drain.
pub const MAX_DRAIN_TIMEOUT_S: u64 = 3_600;

/// Most buffers in the shared pool.
pub const MAX_SHARED_BUFFERS: u32 = 1 << 20;

/// Longest pacing period: one buffer of credit per 100 ms is already a crawl;
/// longer ones stall every IO.
pub const MAX_PERIOD_US: f64 = 100_000.0;

/// Shortest pacing period the reactors can honour.
pub const MIN_PERIOD_US: f64 = 0.1;

/// Largest byte amount for pacing windows, credit and targets.
pub const MAX_PACING_BYTES: u64 = 1 << 34;

/// A field error: (field, message).
pub type FieldError = (&'static str, String);

/// `value` must lie in `min..=max`.
pub fn in_range<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: T,
    min: T,
    max: T,
) -> Result<(), FieldError> {
    if value < min || value > max {
        return Err((
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

/// The pacer's own checks plus upper bounds it leaves to the target.
pub fn check_pacing(p: &PacingConfig) -> Result<(), FieldError> {
    p.validate()?;
    if let Some(period) = p.period_us {
        if !(MIN_PERIOD_US..=MAX_PERIOD_US).contains(&period) {
            return Err((
                "period_us",
                format!("must be between {MIN_PERIOD_US} and {MAX_PERIOD_US} us, got {period}"),
            ));
        }
    }
    for (field, value) in [
        ("credit", p.credit),
        ("target_in_flight", p.target_in_flight),
        ("max_window", Some(p.max_window)),
    ] {
        if let Some(v) = value {
            in_range(field, v, 1, MAX_PACING_BYTES)?;
        }
    }
    if let Some(ops) = p.device_ops {
        in_range("device_ops", ops, 1, MAX_REQUESTS_PER_REACTOR)?;
    }
    if p.burst > 1000.0 {
        return Err((
            "burst",
            format!("must be at most 1000 periods, got {}", p.burst),
        ));
    }
    Ok(())
}

/// Every rate of a cost model is a finite number above zero: the pacer divides by them.
pub fn check_cost(c: &CostModel) -> Result<(), FieldError> {
    for (field, v) in [
        ("rbps", c.rbps),
        ("rseqiops", c.rseqiops),
        ("rrandiops", c.rrandiops),
        ("wbps", c.wbps),
        ("wseqiops", c.wseqiops),
        ("wrandiops", c.wrandiops),
    ] {
        if !(v.is_finite() && v >= 1.0) {
            return Err((
                field,
                format!("must be a finite rate of at least 1, got {v}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_models_refuse_nan_infinity_zero_and_negatives() {
        for bad in [f64::NAN, f64::INFINITY, 0.0, -5.0] {
            let mut c = CostModel::nvme();
            c.wseqiops = bad;
            assert_eq!(check_cost(&c).map_err(|e| e.0), Err("wseqiops"), "{bad}");
        }
        assert!(check_cost(&CostModel::memory()).is_ok());
    }

    #[test]
    fn pacing_period_is_bounded() {
        let mut p = PacingConfig {
            mode: pace::pacer::Mode::Rate,
            period_us: Some(1e9),
            ..PacingConfig::default()
        };
        assert_eq!(check_pacing(&p).map_err(|e| e.0), Err("period_us"));
        p.period_us = Some(500.0);
        assert!(check_pacing(&p).is_ok());
        p.max_window = u64::MAX;
        assert_eq!(check_pacing(&p).map_err(|e| e.0), Err("max_window"));
    }
}
