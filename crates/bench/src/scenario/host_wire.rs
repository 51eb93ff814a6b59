//! Per-host wire settings: one tc rate and netem delay for every host, or
//! one each, so hosts on links of different speeds share one target.

use serde::{Deserialize, Serialize};

/// A host setting given once for every host, or once per host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PerHost {
    Same(String),
    Each(Vec<String>),
}

impl PerHost {
    /// Host `i`'s value (0-based).
    pub fn host(&self, i: usize) -> Option<&str> {
        match self {
            PerHost::Same(v) => Some(v),
            PerHost::Each(v) => v.get(i).map(String::as_str),
        }
    }

    pub(super) fn len_matches(&self, hosts: usize) -> bool {
        match self {
            PerHost::Same(_) => true,
            PerHost::Each(v) => v.len() == hosts,
        }
    }
}

impl std::fmt::Display for PerHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerHost::Same(v) => write!(f, "{v} each"),
            PerHost::Each(v) => write!(f, "{} (one per host)", v.join(", ")),
        }
    }
}

/// One host's wire: tc rate and netem delay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostWire {
    pub rate: Option<String>,
    pub delay: Option<String>,
}

impl HostWire {
    /// The shaped rate in Gb/s, if it is set and reads as a tc rate.
    pub fn rate_gbps(&self) -> Option<f64> {
        parse_tc_rate(self.rate.as_deref()?).map(|bps| bps / 1e9)
    }
}

/// A tc rate ("2gbit", "500mbit", "250kbit", "1000000bit") in bits/s.
pub fn parse_tc_rate(s: &str) -> Option<f64> {
    let s = s.trim().to_ascii_lowercase();
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let v: f64 = num.parse().ok()?;
    let mult = match unit {
        "bit" | "" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        _ => return None,
    };
    (v > 0.0).then_some(v * mult)
}
