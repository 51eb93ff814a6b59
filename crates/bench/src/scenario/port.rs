//! The target's port: the wire all hosts share on the target's side. A
//! netns scenario may shape it (`[hosts] port_rate`), and an iopace target
//! may be told its capacity (`[[target]] port_gbps`), as a listener's
//! `gbps` tells a deployed target its NIC port's.

use serde::{Deserialize, Serialize};

use super::{parse_tc_rate, Point, Scenario, TargetSpec};

/// The sweep variable that sets the target port's tc rate.
pub const PORT_RATE_VAR: &str = "port_rate";

/// What an iopace target is told of its port's capacity.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PortGbps {
    /// A capacity in Gb/s.
    Gbps(f64),
    /// `"wire"`: the target port's shaped rate at each point.
    Wire(String),
}

/// The keyword for a capacity taken from the shaped port.
pub const WIRE: &str = "wire";

/// The target port's tc rate at a point: a swept `port_rate`, else
/// `[hosts] port_rate`; None: the port is not shaped.
pub fn port_rate_at(s: &Scenario, p: &Point) -> Option<String> {
    p.vars
        .get(PORT_RATE_VAR)
        .cloned()
        .or_else(|| s.hosts.port_rate.clone())
}

/// Whether any point shapes the target port (it then has a veth of its
/// own, see `wire::Wire::up`).
pub fn port_shaped(s: &Scenario) -> bool {
    s.hosts.port_rate.is_some() || s.sweep.contains_key(PORT_RATE_VAR)
}

/// The capacity, Gb/s, that target `spec` is told its port has at a
/// point; None: it is told none (its port is unknown to the pacer).
pub fn port_gbps_at(s: &Scenario, spec: &TargetSpec, p: &Point) -> Option<f64> {
    match spec.port_gbps.as_ref()? {
        PortGbps::Gbps(g) => Some(*g),
        PortGbps::Wire(_) => parse_tc_rate(&port_rate_at(s, p)?).map(|bps| bps / 1e9),
    }
}

/// Each host's max-min fair share, Gb/s, of a port of `port` Gb/s, each
/// capped by its own link (None: unshaped, no cap). Without a port the
/// share is the link.
pub fn fair_shares(links: &[Option<f64>], port: Option<f64>) -> Vec<Option<f64>> {
    let Some(port) = port else {
        return links.to_vec();
    };
    let mut order: Vec<usize> = (0..links.len()).collect();
    let cap = |i: usize| links[i].unwrap_or(f64::INFINITY);
    order.sort_by(|a, b| cap(*a).total_cmp(&cap(*b)));
    let mut shares = vec![None; links.len()];
    let mut left = port;
    for (k, &i) in order.iter().enumerate() {
        let even = left / (order.len() - k) as f64;
        let share = cap(i).min(even);
        shares[i] = Some(share);
        left -= share;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_narrower_than_the_links_is_shared_max_min() {
        let links = [Some(1.0), Some(0.5), Some(0.25)];
        assert_eq!(fair_shares(&links, None), links.to_vec());
        // 1 Gb/s over three: the 250 Mb/s host takes its link, the other
        // two split what is left.
        let s = fair_shares(&links, Some(1.0));
        assert_eq!(s, [Some(0.375), Some(0.375), Some(0.25)]);
        // A port wider than the links' sum leaves every host its link.
        assert_eq!(fair_shares(&links, Some(2.0)), links.to_vec());
        // An unshaped host takes what the shaped ones leave.
        let s = fair_shares(&[None, Some(0.25)], Some(1.0));
        assert_eq!(s, [Some(0.75), Some(0.25)]);
    }
}
