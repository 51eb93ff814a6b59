//! The fairness oracle: what a perfect pacer would give each host of a
//! scenario, and the fewest buffers it would need to do so.
//!
//! Each host is one flow whose rate loads every constraint it crosses:
//! its port and its own link (replies one way, write payloads the other),
//! and each drive it uses, in device-nanoseconds per byte from the drive's
//! cost model and the host's mix of sizes and reads. Its queue depth caps
//! it by Little's law at its unloaded round trip. Tenants divide by weight
//! and the hosts of a tenant equally, by progressive filling ([`fill`]) on
//! each host's dominant share of what it shares: bytes at a port, device
//! time at a drive.
//! The bandwidth-delay floor is each host's ideal rate times that round
//! trip, summed. A port that steps mid-run is solved before and after the
//! step, each weighted by its time in the measured stretch.

mod alone;
pub mod fill;
mod table;

pub use table::render;

use pace::pacer::IoKind;

use crate::devices::Dev;
use crate::hosts::{self, Host};
use crate::scenario::{DeviceKind, Protocol, RunConfig, Scenario};

/// The oracle's answer for one run at one QD.
#[derive(Debug, Clone)]
pub struct Ideal {
    /// Each host's ideal payload rate, bytes/s.
    pub host_bps: Vec<f64>,
    /// Each host's tenant (0 without tenants).
    pub tenant: Vec<usize>,
    /// Each host's group in the scenario.
    pub group: Vec<usize>,
    /// Each host's queue depth.
    pub qd: Vec<u32>,
    /// Bytes in flight a perfect pacer needs: rate x round trip, summed.
    pub floor_bytes: f64,
    /// What holds each host to its ideal rate (in the longer stretch, when
    /// a port steps).
    pub limit: Vec<Limit>,
    /// Each host's queue-depth bound, bytes/s: QD x mean IO over its
    /// unloaded round trip. Near its ideal rate, the bound is out of a
    /// closed loop's reach: at a few times it, queueing at the bottleneck
    /// no longer costs rate.
    pub qd_bps: Vec<f64>,
}

/// What holds a host to its ideal rate: its queue depth (by Little's law at
/// its unloaded round trip, a bound a closed loop reaches only well past
/// it), its own link, a target port, or a drive it shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Qd,
    Link,
    Port,
    Device,
}

/// Where each constraint sits in the filling problem: each port's egress
/// and ingress, then each host's link both ways, then each drive. The one
/// place that knows it: the problem is built, the shared constraints told
/// from the hosts' own, and a frozen flow's limit named by it.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ports: usize,
    hosts: usize,
}

impl Layout {
    /// Port `p`'s egress (its ingress follows).
    fn port(self, p: usize) -> usize {
        2 * p
    }

    /// Host `i`'s link toward it (the other way follows).
    fn link(self, i: usize) -> usize {
        2 * self.ports + 2 * i
    }

    /// Drive `d`.
    fn device(self, d: usize) -> usize {
        2 * self.ports + 2 * self.hosts + d
    }

    /// Constraint `c` is a host's own link.
    fn own_link(self, c: usize) -> bool {
        (self.link(0)..self.device(0)).contains(&c)
    }

    /// What constraint `c` stands for (`None`: the host's own cap, its QD).
    fn limit(self, c: Option<usize>) -> Limit {
        match c {
            None => Limit::Qd,
            Some(c) if c < self.link(0) => Limit::Port,
            Some(c) if c < self.device(0) => Limit::Link,
            Some(_) => Limit::Device,
        }
    }
}

impl Ideal {
    pub fn total_bps(&self) -> f64 {
        self.host_bps.iter().sum()
    }

    /// Each tenant's ideal rate, bytes/s.
    pub fn tenant_bps(&self) -> Vec<f64> {
        let n = self.tenant.iter().copied().max().map_or(0, |t| t + 1);
        let mut out = vec![0.0; n];
        for (t, r) in self.tenant.iter().zip(&self.host_bps) {
            out[*t] += r;
        }
        out
    }
}

/// The ideal allocation of `run` at `qd`: each host capped at what it
/// carries alone ([`alone`]), which runs the simulator once per host group
/// and port.
pub fn ideal(sc: &Scenario, run: &RunConfig, qd: u32) -> Ideal {
    solve(sc, run, qd, |hosts| Some(alone::rates(sc, run, qd, hosts)))
}

/// The allocation with each host's QD bound at its unloaded round trip
/// (Little's law), no simulation: the bound [`ideal`] scales.
pub fn bound(sc: &Scenario, run: &RunConfig, qd: u32) -> Ideal {
    solve(sc, run, qd, |_| None)
}

/// One stretch of the measured time (ports at one rate each): its filling
/// problem, the hosts' unloaded round trips, and its share of the time.
struct Phase {
    problem: fill::Problem,
    rtt: Vec<f64>,
    share: f64,
}

/// The allocation, each host capped at its rate alone where `alone` gives
/// them (from the hosts, which are built once here).
fn solve(
    sc: &Scenario,
    run: &RunConfig,
    qd: u32,
    alone: impl FnOnce(&[Host]) -> Option<Vec<f64>>,
) -> Ideal {
    let devs = Dev::all(&sc.devices);
    let (hosts, _) = hosts::hosts(sc, run, qd, devs.len());
    let alone = alone(&hosts);
    let tenants = run.pacing.tenants.len().max(1);
    let tenant: Vec<usize> = hosts.iter().map(|h| h.tenant.min(tenants - 1)).collect();
    let warm = sc.warmup_ms as f64;
    let end = warm + sc.duration_ms as f64;
    let layout = Layout {
        ports: sc.ports.len(),
        hosts: hosts.len(),
    };
    let mut phases: Vec<Phase> = port_phases(sc, warm, end)
        .into_iter()
        .map(|(rates, share)| {
            let w = World {
                sc,
                run,
                devs: &devs,
                port_bps: &rates,
            };
            Phase {
                problem: w.problem(&hosts, &tenant, layout),
                rtt: hosts.iter().map(|h| w.round_trip(h)).collect(),
                share,
            }
        })
        .collect();
    let qd_bps = (0..hosts.len())
        .map(|i| {
            phases
                .iter()
                .map(|p| p.problem.flows[i].cap * p.share)
                .sum()
        })
        .collect();
    let held_alone = alone.map_or_else(|| vec![None; hosts.len()], |a| cap_alone(&mut phases, &a));
    let mut host_bps = vec![0.0; hosts.len()];
    let mut limit = vec![Limit::Qd; hosts.len()];
    let (mut longest, mut floor) = (0.0, 0.0);
    for phase in &phases {
        let (solved, froze) = dominant_fill(&phase.problem, layout);
        for (i, r) in solved.iter().enumerate() {
            host_bps[i] += r * phase.share;
            floor += r * phase.rtt[i] * phase.share;
        }
        if phase.share > longest {
            longest = phase.share;
            for (i, c) in froze.into_iter().enumerate() {
                limit[i] = layout.limit(c.or(held_alone[i]));
            }
        }
    }
    Ideal {
        host_bps,
        group: hosts.iter().map(|h| h.group).collect(),
        qd: hosts.iter().map(|h| h.qd).collect(),
        tenant,
        floor_bytes: floor,
        limit,
        qd_bps,
    }
}

/// A flow's rate with nobody beside it, and what holds it there (`None`:
/// its own cap): the least of its cap and each constraint it loads.
fn solo(flow: &fill::Flow, capacity: &[f64]) -> (f64, Option<usize>) {
    flow.loads
        .iter()
        .map(|&(c, a)| (capacity[c] / a, Some(c)))
        .fold(
            (flow.cap, None),
            |best, x| if x.0 < best.0 { x } else { best },
        )
}

/// Caps each host at the share of its solo bound that it reached alone
/// (`alone`, bytes/s), in every phase. What held it alone, for the hosts
/// this cap now holds.
fn cap_alone(phases: &mut [Phase], alone: &[f64]) -> Vec<Option<usize>> {
    let mut held = vec![None; alone.len()];
    for (i, &got) in alone.iter().enumerate() {
        let unloaded: f64 = phases
            .iter()
            .map(|p| solo(&p.problem.flows[i], &p.problem.capacity).0 * p.share)
            .sum();
        if unloaded <= 0.0 || got >= unloaded {
            continue;
        }
        let reached = got / unloaded;
        for p in phases.iter_mut() {
            let (rate, by) = solo(&p.problem.flows[i], &p.problem.capacity);
            p.problem.flows[i].cap = p.problem.flows[i].cap.min(reached * rate);
            held[i] = by;
        }
    }
    held
}

/// Progressive filling on each flow's dominant share of the shared
/// constraints (dominant resource fairness): flows that meet at a port
/// grow equal in bytes, flows that meet at a drive equal in device time,
/// as iocost divides a drive. A flow's own link caps it but does not set
/// its unit. Also what froze each flow (see
/// [`fill::solve_limits`]).
fn dominant_fill(p: &fill::Problem, layout: Layout) -> (Vec<f64>, Vec<Option<usize>>) {
    let scale: Vec<f64> = p
        .flows
        .iter()
        .map(|f| {
            let dominant = f
                .loads
                .iter()
                .filter(|(c, _)| !layout.own_link(*c))
                .map(|&(c, a)| a / p.capacity[c])
                .fold(0.0, f64::max);
            if dominant > 0.0 {
                1.0 / dominant
            } else {
                1.0
            }
        })
        .collect();
    let shares = fill::Problem {
        flows: p
            .flows
            .iter()
            .zip(&scale)
            .map(|(f, &k)| fill::Flow {
                group: f.group,
                cap: f.cap / k,
                loads: f.loads.iter().map(|&(c, a)| (c, a * k)).collect(),
            })
            .collect(),
        ..p.clone()
    };
    let (rates, limits) = fill::solve_limits(&shares);
    let rates = rates.iter().zip(&scale).map(|(x, k)| x * k).collect();
    (rates, limits)
}

/// The ports' payload rates (bytes/s) in each stretch of the measured
/// time, with that stretch's share of it.
fn port_phases(sc: &Scenario, warm_ms: f64, end_ms: f64) -> Vec<(Vec<f64>, f64)> {
    let before: Vec<f64> = sc.ports.iter().map(|p| p.rate_gbps * 1e9 / 8.0).collect();
    let mut after = before.clone();
    let mut at = end_ms;
    for (i, p) in sc.ports.iter().enumerate() {
        if let Some((ms, gbps)) = p.step {
            after[i] = gbps * 1e9 / 8.0;
            at = at.min(ms as f64);
        }
    }
    let span = end_ms - warm_ms;
    let first = ((at - warm_ms) / span).clamp(0.0, 1.0);
    [(before, first), (after, 1.0 - first)]
        .into_iter()
        .filter(|(_, s)| *s > 0.0)
        .collect()
}

/// The scenario's hardware with the ports at given rates.
struct World<'a> {
    sc: &'a Scenario,
    run: &'a RunConfig,
    devs: &'a [Dev],
    port_bps: &'a [f64],
}

/// A host's IO mix: (bytes, share of IOs, read) triples.
fn mix(h: &Host) -> Vec<(u32, f64, IoKind)> {
    let total: u32 = h.bssplit.iter().map(|b| b.1).sum();
    let read = f64::from(h.read_pct.min(100)) / 100.0;
    let mut out = Vec::new();
    for &(bytes, w) in &h.bssplit {
        let share = f64::from(w) / f64::from(total.max(1));
        out.push((bytes, share * read, IoKind::Read));
        out.push((bytes, share * (1.0 - read), IoKind::Write));
    }
    out.retain(|m| m.1 > 0.0);
    out
}

fn mean_bytes(h: &Host) -> f64 {
    mix(h).iter().map(|(b, s, _)| f64::from(*b) * s).sum()
}

/// The share of an NVMe/TCP host's IOs that wait a round trip more, for
/// their R2T: writes past what a capsule carries (the target's IOCCSZ).
fn r2t_share(h: &Host) -> f64 {
    if h.protocol != Protocol::NvmeTcp {
        return 0.0;
    }
    let in_capsule = proto::nvme::ctrl::Limits::default().in_capsule;
    mix(h)
        .iter()
        .filter(|(b, _, kind)| *kind == IoKind::Write && *b > in_capsule)
        .map(|m| m.1)
        .sum()
}

impl World<'_> {
    /// The host link's payload rate, bytes/s (`None`: as fast as its port).
    fn link_bps(&self, h: &Host) -> Option<f64> {
        self.sc.hosts[h.group].link_gbps.map(|g| g * 1e9 / 8.0)
    }

    /// The rate one IO crosses the wire at, unloaded.
    fn wire_bps(&self, h: &Host) -> f64 {
        let port = self.port_bps[h.port];
        self.link_bps(h).map_or(port, |l| l.min(port))
    }

    /// Device-nanoseconds an IO of the host's mix costs `dev` on average,
    /// and the mean time from submission to completion, unloaded. The
    /// target sends an IO larger than a buffer to the device as one piece
    /// per buffer, each paying the per-IO cost; the pieces of one IO run on
    /// the drive's channels side by side.
    fn device_ns(&self, h: &Host, dev: usize) -> (f64, f64) {
        let d = &self.devs[dev];
        let piece = self.sc.target.buffer_size.max(1);
        let (mut service, mut latency) = (0.0, 0.0);
        for (bytes, share, kind) in mix(h) {
            let pieces = bytes.div_ceil(piece);
            let whole = f64::from(pieces - 1) * d.cost.cost(kind, piece, false);
            let last = d.cost.cost(kind, bytes - (pieces - 1) * piece, false);
            service += share * (whole + last);
            let waves = f64::from(pieces.div_ceil(d.channels().max(1) as u32));
            latency += share * (whole + last) / f64::from(pieces) * waves;
        }
        match d.kind {
            DeviceKind::Nvme => (service, latency + d.latency_ns()),
            DeviceKind::Delay => (0.0, d.latency_ns()),
        }
    }

    /// A host's unloaded round trip for its mean IO, seconds: the RTT (and
    /// another for an NVMe/TCP write's R2T), the device, and the payload
    /// crossing the slower of its link and port.
    fn round_trip(&self, h: &Host) -> f64 {
        let devices = h.devices.len().max(1) as f64;
        let device: f64 = h
            .devices
            .iter()
            .map(|&(d, _)| self.device_ns(h, d).1)
            .sum::<f64>()
            / devices;
        let rtt = h.rtt as f64 / 1e9 * (1.0 + r2t_share(h));
        rtt + device / 1e9 + mean_bytes(h) / self.wire_bps(h)
    }

    /// The progressive-filling problem, its constraints laid out by
    /// `layout`.
    fn problem(&self, hosts: &[Host], tenant: &[usize], layout: Layout) -> fill::Problem {
        let mut capacity: Vec<f64> = self.port_bps.iter().flat_map(|&r| [r, r]).collect();
        debug_assert_eq!(capacity.len(), layout.link(0));
        for h in hosts {
            let l = self.link_bps(h).unwrap_or(f64::INFINITY);
            capacity.extend([l, l]);
        }
        debug_assert_eq!(capacity.len(), layout.device(0));
        capacity.extend(self.devs.iter().map(|d| d.channels() as f64 * 1e9));
        let weights = match self.run.pacing.tenants.len() {
            0 => vec![1.0],
            _ => self.run.pacing.tenants.iter().map(|t| t.weight).collect(),
        };
        let flows = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| self.flow(h, i, tenant[i], layout))
            .collect();
        fill::Problem {
            capacity,
            weights,
            flows,
        }
    }

    /// Host `h` (the `i`th) as a flow over the constraints of `layout`.
    fn flow(&self, h: &Host, i: usize, tenant: usize, layout: Layout) -> fill::Flow {
        let (port, link) = (layout.port(h.port), layout.link(i));
        let read = f64::from(h.read_pct.min(100)) / 100.0;
        let mean = mean_bytes(h);
        let mut loads = Vec::new();
        for (c, a) in [
            (port, read),
            (port + 1, 1.0 - read),
            (link, read),
            (link + 1, 1.0 - read),
        ] {
            if a > 0.0 {
                loads.push((c, a));
            }
        }
        let share = 1.0 / h.devices.len().max(1) as f64;
        for &(d, _) in &h.devices {
            let ns = self.device_ns(h, d).0;
            if ns > 0.0 {
                loads.push((layout.device(d), share * ns / mean));
            }
        }
        let cap = if mean > 0.0 {
            f64::from(h.qd) * mean / self.round_trip(h)
        } else {
            0.0
        };
        fill::Flow {
            group: tenant,
            cap,
            loads,
        }
    }
}

#[cfg(test)]
mod tests;
