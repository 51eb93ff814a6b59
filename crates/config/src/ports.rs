//! The target's network ports, as its listeners declare them. A TCP or
//! NVMe/TCP listener may give the capacity of the wire it listens on
//! (`gbps`); the pacer then measures how full each port is and tells a
//! host held by its own slower link from one waiting for a port it shares
//! (`pace::pacer::PortLoad`). Listeners on one wire (NBD and NVMe/TCP, or
//! IPv4 and IPv6, on one NIC port) name it with `port`, and share its
//! capacity. A listener with neither, or a named port no listener gives a
//! capacity, is on a port the pacer does not know: it counts as shared,
//! as before ports were known. Unix sockets have no wire.

use std::collections::HashMap;

use crate::{ConfigError, LoadedConfig, ServerConfig, TcpListenerConfig};

/// The most a port's capacity may be, Gb/s: above any NIC port.
pub const MAX_PORT_GBPS: f64 = 100_000.0;

/// The longest port name.
const MAX_PORT_NAME: usize = 64;

/// The ports the listeners declare, and which port each listener is on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WirePorts {
    /// Each known port's capacity, Gb/s; a port's index is its place here.
    pub gbps: Vec<f64>,
    /// Each known port's name for reports: its `port`, or else its
    /// listener's address.
    pub names: Vec<String>,
    /// The port of each `[server] tcp` listener, in order; None: unknown.
    pub tcp: Vec<Option<usize>>,
    /// The port of each `[server] nvme_tcp` listener, in order.
    pub nvme_tcp: Vec<Option<usize>>,
}

/// One wire as the listeners describe it, before unknown ones are dropped.
struct Wire {
    name: String,
    named: bool,
    gbps: Option<f64>,
}

impl WirePorts {
    /// The ports of `server`'s listeners (checked by [`check`] first).
    pub fn of(server: &ServerConfig) -> WirePorts {
        let mut wires: Vec<Wire> = Vec::new();
        let mut wire_of = |l: &TcpListenerConfig| -> Option<usize> {
            let found = l
                .port()
                .and_then(|n| wires.iter().position(|w| w.named && w.name == n));
            match found {
                Some(i) => {
                    wires[i].gbps = wires[i].gbps.or(l.gbps());
                    Some(i)
                }
                None if l.port().is_none() && l.gbps().is_none() => None,
                None => {
                    wires.push(Wire {
                        name: l.port().unwrap_or(l.addr()).to_string(),
                        named: l.port().is_some(),
                        gbps: l.gbps(),
                    });
                    Some(wires.len() - 1)
                }
            }
        };
        let tcp: Vec<Option<usize>> = server.tcp.iter().map(&mut wire_of).collect();
        let nvme: Vec<Option<usize>> = server.nvme_tcp.iter().map(&mut wire_of).collect();
        // Only wires with a capacity are ports the pacer knows.
        let mut index = vec![None; wires.len()];
        let mut ports = WirePorts::default();
        for (i, w) in wires.iter().enumerate() {
            if let Some(g) = w.gbps {
                index[i] = Some(ports.gbps.len());
                ports.gbps.push(g);
                ports.names.push(w.name.clone());
            }
        }
        let known = |w: Option<usize>| w.and_then(|i| index[i]);
        ports.tcp = tcp.into_iter().map(known).collect();
        ports.nvme_tcp = nvme.into_iter().map(known).collect();
        ports
    }
}

/// Each listener's `gbps` and `port`: a capacity in range, a short name,
/// and one capacity per named port.
pub(crate) fn check(server: &ServerConfig, at: &LoadedConfig) -> Result<(), ConfigError> {
    let mut declared: HashMap<&str, f64> = HashMap::new();
    let lists = [
        ("server.tcp", &server.tcp),
        ("server.nvme_tcp", &server.nvme_tcp),
    ];
    for (table, list) in lists {
        for (i, l) in list.iter().enumerate() {
            let error = |field: &str, m: String| at.error_at(table, i, field, m);
            if let Some(g) = l.gbps() {
                if !(g > 0.0 && g <= MAX_PORT_GBPS) {
                    let m = format!(
                        "{g}: the wire's capacity in Gb/s, above 0 and at most {MAX_PORT_GBPS}"
                    );
                    return Err(error("gbps", m));
                }
            }
            let Some(name) = l.port() else { continue };
            if name.is_empty() || name.len() > MAX_PORT_NAME {
                let m = format!("`{name}`: a port's name is 1 to {MAX_PORT_NAME} bytes");
                return Err(error("port", m));
            }
            let Some(g) = l.gbps() else { continue };
            match declared.insert(name, g) {
                Some(before) if before != g => {
                    let m = format!(
                        "port `{name}` is {before} Gb/s on another listener and {g} here: \
                         listeners on one port share one capacity"
                    );
                    return Err(error("gbps", m));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn config(server: &str) -> String {
        format!(
            "[server]\nunix = []\n{server}\n\
             [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
             [[export]]\nname = \"a\"\nbdev = \"m\"\n"
        )
    }

    fn ports(server: &str) -> WirePorts {
        let loaded = Config::parse(&config(server), "x.toml").expect("config");
        WirePorts::of(&loaded.config.server)
    }

    #[test]
    fn listeners_with_a_capacity_are_ports_and_the_others_are_unknown() {
        let p = ports(
            "tcp = [\"127.0.0.1:1\", { addr = \"127.0.0.1:2\", gbps = 25 },\n\
             { addr = \"127.0.0.1:3\", tls = \"off\" }, { addr = \"127.0.0.1:4\", gbps = 10.5 }]",
        );
        assert_eq!(p.gbps, [25.0, 10.5]);
        assert_eq!(p.names, ["127.0.0.1:2", "127.0.0.1:4"]);
        assert_eq!(p.tcp, [None, Some(0), None, Some(1)]);
        assert!(p.nvme_tcp.is_empty());
        let none = ports("tcp = [\"127.0.0.1:1\"]\nnvme_tcp = [\"127.0.0.1:2\"]");
        assert!(none.gbps.is_empty());
        assert_eq!((none.tcp, none.nvme_tcp), (vec![None], vec![None]));
    }

    #[test]
    fn listeners_naming_one_port_share_it_and_its_capacity() {
        let p = ports(
            "tcp = [{ addr = \"127.0.0.1:1\", port = \"eth0\" },\n\
             { addr = \"127.0.0.1:2\", port = \"lo\" }, { addr = \"127.0.0.1:3\", gbps = 1 }]\n\
             nvme_tcp = [{ addr = \"127.0.0.1:4\", port = \"eth0\", gbps = 100 }, \"127.0.0.1:5\"]",
        );
        // `lo` has no capacity anywhere: unknown, and it takes no index.
        assert_eq!(p.gbps, [100.0, 1.0]);
        assert_eq!(p.names, ["eth0", "127.0.0.1:3"]);
        assert_eq!(p.tcp, [Some(0), None, Some(1)]);
        assert_eq!(p.nvme_tcp, [Some(0), None]);
    }

    #[test]
    fn a_bad_capacity_or_port_names_its_file_line_and_field() {
        let cases = [
            (
                "tcp = [\n\"127.0.0.1:1\",\n{ addr = \"127.0.0.1:2\", gbps = 0 }]",
                5,
                "server.tcp.gbps",
                "above 0",
            ),
            (
                "tcp = [{ addr = \"127.0.0.1:2\", gbps = -3 }]",
                3,
                "server.tcp.gbps",
                "above 0",
            ),
            (
                "tcp = [{ addr = \"127.0.0.1:2\", gbps = 1e9 }]",
                3,
                "server.tcp.gbps",
                "at most",
            ),
            (
                "tcp = [{ addr = \"127.0.0.1:2\", gbps = nan }]",
                3,
                "server.tcp.gbps",
                "above 0",
            ),
            (
                "tcp = [{ addr = \"127.0.0.1:2\", port = \"\" }]",
                3,
                "server.tcp.port",
                "1 to 64",
            ),
            (
                "tcp = [{ addr = \"127.0.0.1:2\", port = \"e\", gbps = 25 }]\n\
                 nvme_tcp = [{ addr = \"127.0.0.1:3\", port = \"e\", gbps = 10 }]",
                4,
                "server.nvme_tcp.gbps",
                "share one capacity",
            ),
            (
                "nvme_tcp = [{ addr = \"127.0.0.1:3\", tls = \"on\" }]",
                3,
                "server.nvme_tcp.tls",
                "no TLS",
            ),
        ];
        for (server, line, field, says) in cases {
            let e = Config::parse(&config(server), "x.toml").expect_err(server);
            assert_eq!(e.file, "x.toml");
            assert_eq!(e.line, Some(line), "{server}: {e}");
            assert_eq!(e.field.as_deref(), Some(field), "{server}: {e}");
            assert!(e.message.contains(says), "{server}: {e}");
        }
        let e = Config::parse(
            &config("tcp = [{ addr = \"127.0.0.1:2\", gbps = \"fast\" }]"),
            "x.toml",
        )
        .expect_err("a string");
        assert_eq!(e.line, Some(3), "{e}");
    }
}
