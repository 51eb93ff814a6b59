//! `[pacing]`: the pacer's settings, with their defaults named.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    None,
    Buffers,
    Rate,
    #[default]
    Auto,
}

impl Mode {
    /// The mode as `[pacing] mode` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Buffers => "buffers",
            Mode::Rate => "rate",
            Mode::Auto => "auto",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        [Mode::None, Mode::Buffers, Mode::Rate, Mode::Auto]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("`{s}`: expected none, buffers, rate or auto"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tuner {
    IoRate,
    BytesInFlight,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    #[serde(default = "one")]
    pub weight: f64,
    /// Exports whose IO belongs to this tenant.
    #[serde(default)]
    pub exports: Vec<String>,
}

fn one() -> f64 {
    1.0
}

impl TenantConfig {
    /// A tenant of `weight`, with no export of its own yet.
    pub fn new(name: &str, weight: f64) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            weight,
            exports: Vec::new(),
        }
    }
}

/// `[pacing]` in the target's config and in simulator scenarios.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PacingConfig {
    #[serde(default)]
    pub mode: Mode,
    /// rate: period between credits, microseconds.
    #[serde(default)]
    pub period_us: Option<f64>,
    /// rate: bytes of credit per period (default: one buffer).
    #[serde(default)]
    pub credit: Option<u64>,
    /// rate: IOs smaller than this bypass the pacer.
    #[serde(default)]
    pub threshold: Option<u32>,
    /// rate: most IOs in flight per device, across all reactors.
    #[serde(default)]
    pub device_ops: Option<u32>,
    /// rate: periods of unused credit kept (late polls lose nothing up to this).
    #[serde(default = "default_burst")]
    pub burst: f64,
    #[serde(default)]
    pub tuner: Option<Tuner>,
    /// rate, bytes-in-flight tuner: the target, bytes.
    #[serde(default)]
    pub target_in_flight: Option<u64>,
    /// auto: window = gain x rate x latency.
    #[serde(default = "default_gain")]
    pub gain: f64,
    /// auto: upper bound on bytes in flight per reactor.
    #[serde(default = "default_max_window")]
    pub max_window: u64,
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
}

/// rate: periods of unused credit kept.
pub const DEFAULT_BURST: f64 = 4.0;
/// auto: window = gain x rate x latency; 2 keeps the pipeline full through
/// the rate estimate's noise.
pub const DEFAULT_GAIN: f64 = 2.0;
/// auto: most bytes in flight per reactor.
pub const DEFAULT_MAX_WINDOW: u64 = 16 << 20;
/// rate: the period when none is configured (the tuners' base too).
pub const DEFAULT_PERIOD_US: f64 = 10.0;

fn default_burst() -> f64 {
    DEFAULT_BURST
}
fn default_gain() -> f64 {
    DEFAULT_GAIN
}
fn default_max_window() -> u64 {
    DEFAULT_MAX_WINDOW
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            mode: Mode::Auto,
            period_us: None,
            credit: None,
            threshold: None,
            device_ops: None,
            burst: default_burst(),
            tuner: None,
            target_in_flight: None,
            gain: default_gain(),
            max_window: default_max_window(),
            tenants: Vec::new(),
        }
    }
}

impl PacingConfig {
    /// rate: the configured period, ns.
    pub fn period_ns(&self) -> f64 {
        self.period_us.unwrap_or(DEFAULT_PERIOD_US) * 1000.0
    }

    /// Checks values; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.mode == Mode::Rate {
            match self.period_us {
                Some(p) if p > 0.0 && p.is_finite() => {}
                _ => return Err(("period_us", "mode \"rate\" needs a period_us > 0".into())),
            }
        }
        if self.credit == Some(0) {
            return Err(("credit", "must be at least 1 byte".into()));
        }
        if !(self.burst >= 1.0 && self.burst.is_finite()) {
            return Err(("burst", "must be at least 1 period".into()));
        }
        if !(self.gain >= 1.0 && self.gain <= 16.0) {
            return Err(("gain", "must be between 1 and 16".into()));
        }
        if self.max_window < 4096 {
            return Err(("max_window", "must be at least 4096 bytes".into()));
        }
        if self.device_ops == Some(0) {
            return Err(("device_ops", "must be at least 1".into()));
        }
        for t in &self.tenants {
            if !(t.weight > 0.0 && t.weight.is_finite()) {
                return Err((
                    "tenants.weight",
                    format!("tenant `{}`: weight must be > 0", t.name),
                ));
            }
        }
        Ok(())
    }
}
