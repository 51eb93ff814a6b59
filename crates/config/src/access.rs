//! Per-export access control: which clients may open an export (`allow`) and
//! which get it read-only (`read_only_for`), by peer address range (CIDR),
//! Unix-socket peer (`unix`), TLS client-certificate common name (`cn:NAME`)
//! or NVMe host NQN (`hostnqn:NQN`, NVMe/TCP hosts only).
//! The handshake enforces it ([`proto::Access`]); this module only decides.

use std::net::IpAddr;

use proto::Access;

/// One rule of an `allow` or `read_only_for` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// An address range: `10.0.0.0/8`, `::1/128`, or one address.
    Net { addr: IpAddr, prefix: u8 },
    /// Any client on a Unix socket.
    Unix,
    /// A TLS client whose certificate's common name is this.
    CertName(String),
    /// An NVMe/TCP host whose Connect gives this host NQN.
    HostNqn(String),
}

impl Rule {
    pub fn parse(s: &str) -> Result<Rule, String> {
        if s == "unix" {
            return Ok(Rule::Unix);
        }
        if let Some(name) = s.strip_prefix("cn:") {
            return Ok(Rule::CertName(name.to_string()));
        }
        if let Some(nqn) = s.strip_prefix("hostnqn:") {
            return Ok(Rule::HostNqn(nqn.to_string()));
        }
        let (addr, prefix) = s.split_once('/').unwrap_or((s, ""));
        let addr: IpAddr = addr.parse().map_err(|_| {
            format!(
                "`{s}` is not an address range (10.0.0.0/8), `unix`, `cn:NAME` or `hostnqn:NQN`"
            )
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0 to {max}"))?
        };
        Ok(Rule::Net { addr, prefix })
    }

    fn matches(&self, client: &Client) -> bool {
        match (self, client.addr) {
            (Rule::Unix, None) => true,
            (Rule::Net { addr, prefix }, Some(peer)) => in_range(peer, *addr, *prefix),
            (Rule::CertName(name), _) => client.cert_name.as_deref() == Some(name),
            (Rule::HostNqn(nqn), _) => client.hostnqn.as_deref() == Some(nqn),
            _ => false,
        }
    }
}

/// `peer` lies in `net/prefix` (IPv4-mapped IPv6 peers count as IPv4).
fn in_range(peer: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    match (peer, net) {
        (IpAddr::V4(p), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(p) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(p), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(p) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Who a connection is, as far as access control can tell.
#[derive(Debug, Clone, Default)]
pub struct Client {
    /// The TCP peer's address; None on a Unix socket.
    pub addr: Option<IpAddr>,
    /// The TLS client certificate's common name, once TLS is up.
    pub cert_name: Option<String>,
    /// An NVMe/TCP host's NQN, from its Connect.
    pub hostnqn: Option<String>,
}

/// One export's rules.
#[derive(Debug, Clone, Default)]
pub struct ExportRules {
    /// None: every client may open it.
    pub allow: Option<Vec<Rule>>,
    pub read_only_for: Vec<Rule>,
}

impl ExportRules {
    /// What `client` may do with the export.
    pub fn access(&self, client: &Client) -> Access {
        let allowed = match &self.allow {
            None => true,
            Some(rules) => rules.iter().any(|r| r.matches(client)),
        };
        if !allowed {
            Access::Denied
        } else if self.read_only_for.iter().any(|r| r.matches(client)) {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        }
    }
}

/// Every export's rules, in catalog order.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub exports: Vec<(String, ExportRules)>,
}

impl Policy {
    /// No export has any rule: nothing to decide per client.
    pub fn is_open(&self) -> bool {
        self.exports
            .iter()
            .all(|(_, r)| r.allow.is_none() && r.read_only_for.is_empty())
    }

    /// Per export: an `allow` rule names a TLS client certificate, so a
    /// client denied before TLS may be let in once it shows one.
    pub fn tls_opens(&self) -> Vec<bool> {
        let names_cert = |rules: &Vec<Rule>| rules.iter().any(|r| matches!(r, Rule::CertName(_)));
        self.exports
            .iter()
            .map(|(_, r)| r.allow.as_ref().is_some_and(names_cert))
            .collect()
    }

    /// What `client` may do with each export; logs the restrictions with
    /// the peer and the reason, once per connection.
    pub fn for_client(&self, client: &Client, peer: &str) -> Vec<Access> {
        let access: Vec<Access> = self.exports.iter().map(|(_, r)| r.access(client)).collect();
        let named = |want: Access| -> Vec<&str> {
            self.exports
                .iter()
                .zip(&access)
                .filter(|(_, a)| **a == want)
                .map(|((name, _), _)| name.as_str())
                .collect()
        };
        let (denied, read_only) = (named(Access::Denied), named(Access::ReadOnly));
        if !denied.is_empty() || !read_only.is_empty() {
            tracing::info!(
                peer,
                cert_name = client.cert_name.as_deref().unwrap_or("-"),
                ?denied,
                ?read_only,
                "access: exports denied (no allow rule matches) or read-only (a read_only_for rule matches)"
            );
        }
        access
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addr: &str, name: Option<&str>) -> Client {
        Client {
            addr: addr.parse().ok(),
            cert_name: name.map(str::to_string),
            hostnqn: None,
        }
    }

    #[test]
    fn rules_parse_and_match() {
        let net = Rule::parse("10.1.0.0/16").expect("cidr");
        assert!(net.matches(&client("10.1.2.3", None)));
        assert!(!net.matches(&client("10.2.0.1", None)));
        assert!(net.matches(&client("::ffff:10.1.9.9", None)));
        assert!(Rule::parse("::1")
            .expect("v6")
            .matches(&client("::1", None)));
        assert!(Rule::parse("0.0.0.0/0")
            .expect("all")
            .matches(&client("192.0.2.1", None)));
        assert!(Rule::parse("unix")
            .expect("unix")
            .matches(&client("", None)));
        let cn = Rule::parse("cn:client1").expect("cn");
        assert!(cn.matches(&client("192.0.2.1", Some("client1"))));
        assert!(!cn.matches(&client("192.0.2.1", None)));
        let h = Rule::parse("hostnqn:nqn.2014-08.org.nvmexpress:uuid:a").expect("hostnqn");
        let mut host = client("192.0.2.1", None);
        assert!(!h.matches(&host));
        host.hostnqn = Some("nqn.2014-08.org.nvmexpress:uuid:a".into());
        assert!(h.matches(&host));
        assert!(Rule::parse("10.0.0.0/33").is_err());
        assert!(Rule::parse("nonsense").is_err());
    }

    #[test]
    fn allow_then_read_only() {
        let rules = ExportRules {
            allow: Some(vec![Rule::parse("127.0.0.0/8").expect("cidr")]),
            read_only_for: vec![Rule::parse("cn:auditor").expect("cn")],
        };
        assert_eq!(rules.access(&client("10.0.0.1", None)), Access::Denied);
        assert_eq!(rules.access(&client("127.0.0.1", None)), Access::ReadWrite);
        assert_eq!(
            rules.access(&client("127.0.0.1", Some("auditor"))),
            Access::ReadOnly
        );
        assert_eq!(
            ExportRules::default().access(&client("", None)),
            Access::ReadWrite
        );
    }
}
