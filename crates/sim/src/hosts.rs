//! Initiator hosts: each keeps `qd` IOs outstanding over connections to
//! the target, one per device it uses (an NBD connection serves one
//! export), and speaks the protocol's client side: for NBD a fixed-newstyle
//! handshake with NBD_OPT_GO, then request headers; for NVMe/TCP a
//! controller and an I/O queue per device (`nvme_host`, `world/nvme.rs`).

use pace::Nanos;
use proto::{Command, Request};

use crate::scenario::{Protocol, RunConfig, Scenario};

pub(crate) struct Host {
    pub group: usize,
    pub port: usize,
    pub rtt: Nanos,
    pub qd: u32,
    /// The devices it uses, and the socket of its connection to each.
    pub devices: Vec<(usize, usize)>,
    pub tenant: usize,
    pub bssplit: Vec<(u32, u32)>,
    pub read_pct: u32,
    pub delivered: u64,
    /// Bytes per slot, for the BW STDDEV column.
    pub slots: Vec<u64>,
    /// Its link is down until then (a fault).
    pub down_until: Nanos,
    pub protocol: Protocol,
}

/// One host's connection before the target accepts it.
pub(crate) struct Dial {
    pub host: usize,
    pub device: usize,
    pub reactor: usize,
}

/// The hosts of every group, and the connections they open: a host's
/// connections go round the reactors from its own (`one_connection`: all on
/// its own reactor, as one client's connections to one target thread).
pub(crate) fn hosts(
    sc: &Scenario,
    run: &RunConfig,
    qd: u32,
    devices: usize,
) -> (Vec<Host>, Vec<Dial>) {
    let reactors = run.reactors.unwrap_or(sc.target.reactors);
    let mut hosts = Vec::new();
    let mut dials = Vec::new();
    for (gi, g) in sc.hosts.iter().enumerate() {
        for _ in 0..g.count {
            let i = hosts.len();
            let port = g.port.unwrap_or(i % sc.ports.len());
            let rtt_us = g.rtt_us.unwrap_or(sc.ports[port].rtt_us);
            let used: Vec<usize> = if g.devices.is_empty() {
                (0..devices).collect()
            } else {
                g.devices.clone()
            };
            let conns = used
                .iter()
                .map(|&device| {
                    let k = if g.one_connection { 0 } else { device };
                    dials.push(Dial {
                        host: i,
                        device,
                        reactor: (i + k) % reactors,
                    });
                    (device, dials.len() - 1)
                })
                .collect();
            hosts.push(Host {
                group: gi,
                port,
                rtt: (rtt_us * 1000.0) as Nanos,
                qd: g
                    .fixed_qd
                    .unwrap_or((f64::from(qd) * g.qd_scale).round() as u32),
                devices: conns,
                tenant: g.tenant,
                bssplit: run.bssplit.clone().unwrap_or_else(|| g.bssplit.clone()),
                read_pct: run.read_pct.unwrap_or(g.read_pct),
                delivered: 0,
                slots: Vec::new(),
                down_until: 0,
                protocol: run.protocol.unwrap_or(g.protocol),
            });
        }
    }
    (hosts, dials)
}

/// The client's half of the handshake, sent at once: fixed newstyle
/// without zeroes, then NBD_OPT_GO for `export` with no info requests.
pub(crate) fn handshake(export: &str) -> Vec<u8> {
    let mut m = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    m.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    m.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
    m.extend_from_slice(&(export.len() as u32).to_be_bytes());
    m.extend_from_slice(export.as_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m
}

/// A request header: READ or WRITE of `length` bytes at `offset`.
pub(crate) fn request(read: bool, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(proto::REQUEST_HEADER_LEN);
    proto::encode_request(
        &mut out,
        &Request {
            flags: 0,
            command: if read { Command::Read } else { Command::Write },
            cookie,
            offset,
            length: u64::from(length),
        },
        false,
    );
    out
}
