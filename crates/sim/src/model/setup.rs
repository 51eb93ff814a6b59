//! Building a run: the hosts and their connections, and the reactors' pacers.

use std::collections::VecDeque;
use std::sync::Arc;

use pace::pacer::{DeviceOps, DeviceQos, LinkWindow, Pacer, TenantClock};
use pace::Nanos;

use super::{Conn, Host};
use crate::devices::Dev;
use crate::scenario::{RunConfig, Scenario};

/// The hosts of every group, and their connections spread over the reactors
/// (a host's k-th connection on the reactor after its (k-1)-th).
pub(super) fn hosts_and_conns(
    sc: &Scenario,
    run: &RunConfig,
    qd: u32,
    devices: usize,
) -> (Vec<Host>, Vec<Conn>) {
    let reactors = run.reactors.unwrap_or(sc.target.reactors);
    let mut hosts = Vec::new();
    let mut conns = Vec::new();
    for (gi, g) in sc.hosts.iter().enumerate() {
        for _ in 0..g.count {
            let i = hosts.len();
            let port = g.port.unwrap_or(i % sc.ports.len());
            let rtt_us = g.rtt_us.unwrap_or(sc.ports[port].rtt_us);
            let n_conns = if g.one_connection { 1 } else { devices };
            let conn_base = conns.len();
            conns.extend((0..n_conns).map(|k| Conn {
                reactor: (i + k) % reactors,
                blocked: None,
                backlog: VecDeque::new(),
                payload_pieces: 0,
            }));
            hosts.push(Host {
                group: gi,
                port,
                rtt: (rtt_us * 1000.0) as Nanos,
                qd: g
                    .fixed_qd
                    .unwrap_or((f64::from(qd) * g.qd_scale).round() as u32),
                devices: if g.devices.is_empty() {
                    (0..devices).collect()
                } else {
                    g.devices.clone()
                },
                tenant: g.tenant,
                bssplit: run.bssplit.clone().unwrap_or_else(|| g.bssplit.clone()),
                read_pct: run.read_pct.unwrap_or(g.read_pct),
                conn_base,
                one_connection: g.one_connection,
                delivered: 0,
                slots: Vec::new(),
            });
        }
    }
    (hosts, conns)
}

/// One pacer per reactor, sharing the tenant clock, latency targets, link
/// window and device op limit as the target's reactors do.
pub(super) fn pacers(
    sc: &Scenario,
    run: &RunConfig,
    devs: &[Dev],
    qos: &Arc<DeviceQos>,
) -> Vec<Pacer> {
    let reactors = run.reactors.unwrap_or(sc.target.reactors);
    let clock = TenantClock::with_reactors(run.pacing.tenants.len().max(1), reactors);
    let link = LinkWindow::new(reactors);
    let ops = run
        .pacing
        .device_ops
        .map(|limit| DeviceOps::new(devs.len(), limit));
    (0..reactors)
        .map(|r| {
            let mut p = Pacer::new(
                run.pacing.clone(),
                devs.len(),
                sc.target.buffer_size,
                ops.clone(),
                0,
            );
            for (i, d) in devs.iter().enumerate() {
                p.set_cost_model(i, d.cost);
            }
            p.share_tenants(clock.clone());
            p.share_qos(qos.clone());
            p.share_link(link.clone(), r);
            p
        })
        .collect()
}
