//! A case's run against the oracle, by the goals of `auto`: every host
//! near its share, the total near the oracle's, buffers near the
//! bandwidth-delay floor, tenants in the oracle's ratio, and a QD 1
//! tenant's p99 near its physical floor.

use pace::pacer::IoKind;
use serde::Serialize;

use crate::devices::Dev;
use crate::oracle::{self, Ideal};
use crate::report::Row;
use crate::scenario::{DeviceKind, HostGroup, Scenario};
use crate::simulate;

/// A host passes with this share of its ideal rate...
pub const HOST_SHARE: f64 = 0.95;
/// ...or, when its ideal is under [`SMALL_SHARE_GBPS`], within this many Gb/s.
pub const SMALL_SLACK_GBPS: f64 = 0.2;
pub const SMALL_SHARE_GBPS: f64 = 4.0;
/// The run's total against the oracle's.
pub const TOTAL_SHARE: f64 = 0.95;
/// Buffers in flight may reach the larger of this and twice the floor...
pub const BUFS_FLOOR_MIB: f64 = 8.0;
/// ...where no IO is larger than this.
pub const BUFS_MAX_IO: u32 = 128 << 10;
/// A tenant's share of the bytes against the oracle's, relative.
pub const TENANT_SLACK: f64 = 0.05;

/// What went wrong in a case, one kind per goal.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Miss {
    HostShare {
        host: usize,
        group: usize,
        ideal_gbps: f64,
        got_gbps: f64,
        /// What holds the host to its ideal.
        limit: oracle::Limit,
        /// Its queue-depth bound over its ideal (see `Ideal::qd_bps`).
        qd_headroom: f64,
    },
    Total {
        ideal_gbps: f64,
        got_gbps: f64,
    },
    Buffers {
        mean_mib: f64,
        floor_mib: f64,
    },
    TenantRatio {
        tenant: usize,
        ideal_share: f64,
        got_share: f64,
    },
    Qd1Latency {
        group: usize,
        p99_us: f64,
        solo_p99_us: f64,
        floor_us: f64,
    },
    /// The engine's books: an IO issued neither completed nor in flight.
    Books,
}

impl Miss {
    /// The goal this miss breaks, for the report's tally.
    pub fn goal(&self) -> &'static str {
        match self {
            Miss::HostShare { .. } => "host share",
            Miss::Total { .. } => "total",
            Miss::Buffers { .. } => "buffers",
            Miss::TenantRatio { .. } => "tenant ratio",
            Miss::Qd1Latency { .. } => "QD 1 p99",
            Miss::Books => "books",
        }
    }
}

/// A case's numbers against the oracle.
#[derive(Debug, Clone, Serialize)]
pub struct Score {
    pub total_pct: f64,
    /// The worst host's achieved share of its ideal, %.
    pub worst_host_pct: f64,
    pub bufs_mib: f64,
    pub floor_mib: f64,
    pub misses: Vec<Miss>,
}

const MIB: f64 = (1u64 << 20) as f64;

fn gbps(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e9
}

/// Runs the scenario's first run at its first QD and scores it.
pub fn score(sc: &Scenario) -> Score {
    let run = &sc.runs[0];
    let qd = sc.qds[0];
    let row = simulate(sc, run, qd);
    let ideal = oracle::ideal(sc, run, qd);
    let mut misses = host_misses(&row, &ideal);
    let total = row.per_host_gbps.iter().sum::<f64>();
    let ideal_total = gbps(ideal.total_bps());
    if total < TOTAL_SHARE * ideal_total {
        misses.push(Miss::Total {
            ideal_gbps: ideal_total,
            got_gbps: total,
        });
    }
    let floor_mib = ideal.floor_bytes / MIB;
    let largest = sc
        .hosts
        .iter()
        .flat_map(|g| g.bssplit.iter().map(|b| b.0))
        .max();
    if largest.unwrap_or(0) <= BUFS_MAX_IO && row.bufs_mib_avg > BUFS_FLOOR_MIB.max(2.0 * floor_mib)
    {
        misses.push(Miss::Buffers {
            mean_mib: row.bufs_mib_avg,
            floor_mib,
        });
    }
    misses.extend(tenant_misses(&row, &ideal));
    misses.extend(qd1_misses(sc, &row));
    if !row.conserved {
        misses.push(Miss::Books);
    }
    Score {
        total_pct: pct(total, ideal_total),
        worst_host_pct: worst_host_pct(&row, &ideal),
        bufs_mib: row.bufs_mib_avg,
        floor_mib,
        misses,
    }
}

fn pct(got: f64, ideal: f64) -> f64 {
    if ideal > 0.0 {
        100.0 * got / ideal
    } else {
        100.0
    }
}

fn host_passes(ideal: f64, got: f64) -> bool {
    got >= HOST_SHARE * ideal || (ideal < SMALL_SHARE_GBPS && got >= ideal - SMALL_SLACK_GBPS)
}

fn host_misses(row: &Row, ideal: &Ideal) -> Vec<Miss> {
    let mut out = Vec::new();
    for (host, (&want, &got)) in ideal.host_bps.iter().zip(&row.per_host_gbps).enumerate() {
        let want = gbps(want);
        if !host_passes(want, got) {
            out.push(Miss::HostShare {
                host,
                group: ideal.group[host],
                ideal_gbps: want,
                got_gbps: got,
                limit: ideal.limit[host],
                qd_headroom: ideal.qd_bps[host] / ideal.host_bps[host].max(1.0),
            });
        }
    }
    out
}

fn worst_host_pct(row: &Row, ideal: &Ideal) -> f64 {
    ideal
        .host_bps
        .iter()
        .zip(&row.per_host_gbps)
        .map(|(&w, &g)| pct(g, gbps(w)))
        .fold(f64::INFINITY, f64::min)
        .min(100.0)
}

/// Each tenant's share of the bytes against the oracle's, where the
/// difference is more than [`SMALL_SLACK_GBPS`] too.
fn tenant_misses(row: &Row, ideal: &Ideal) -> Vec<Miss> {
    let want = ideal.tenant_bps();
    if want.len() < 2 {
        return Vec::new();
    }
    let mut got = vec![0.0; want.len()];
    for (t, g) in ideal.tenant.iter().zip(&row.per_host_gbps) {
        got[*t] += g;
    }
    let (want_sum, got_sum) = (want.iter().sum::<f64>(), got.iter().sum::<f64>());
    if want_sum <= 0.0 || got_sum <= 0.0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in 0..want.len() {
        let (w, g) = (want[t] / want_sum, got[t] / got_sum);
        let off_gbps = (gbps(want[t]) - got[t]).abs();
        if w > 0.0 && (g / w - 1.0).abs() > TENANT_SLACK && off_gbps > SMALL_SLACK_GBPS {
            out.push(Miss::TenantRatio {
                tenant: t,
                ideal_share: w,
                got_share: g,
            });
        }
    }
    out
}

/// Each lone QD 1 group's p99 against max(2 x solo, 1.25 x the physical
/// floor): its p99 alone plus one heavy IO ahead of it at the device and
/// on the wire.
fn qd1_misses(sc: &Scenario, row: &Row) -> Vec<Miss> {
    let mut out = Vec::new();
    for (g, group) in sc.hosts.iter().enumerate() {
        if group.fixed_qd != Some(1) || group.count != 1 || sc.hosts.len() < 2 {
            continue;
        }
        let solo = Scenario {
            hosts: vec![group.clone()],
            ..sc.clone()
        };
        let solo_p99 = simulate(&solo, &solo.runs[0], sc.qds[0]).per_group_p99_us[0];
        let floor = solo_p99 + heavy_io_us(sc, g);
        let p99 = row.per_group_p99_us[g];
        if p99 > (2.0 * solo_p99).max(1.25 * floor) {
            out.push(Miss::Qd1Latency {
                group: g,
                p99_us: p99,
                solo_p99_us: solo_p99,
                floor_us: floor,
            });
        }
    }
    out
}

/// The time one of the other groups' largest IOs takes at a drive the
/// group shares with them and on the slowest port, us.
fn heavy_io_us(sc: &Scenario, g: usize) -> f64 {
    let devs = Dev::all(&sc.devices);
    let used = |h: &HostGroup| -> Vec<usize> {
        match h.devices.is_empty() {
            true => (0..devs.len()).collect(),
            false => h.devices.clone(),
        }
    };
    let mine = used(&sc.hosts[g]);
    let mut device_us = 0.0f64;
    let mut wire_us = 0.0f64;
    let slowest_port = sc
        .ports
        .iter()
        .map(|p| p.rate_gbps)
        .fold(f64::INFINITY, f64::min);
    for (o, other) in sc.hosts.iter().enumerate() {
        if o == g {
            continue;
        }
        let size = other.bssplit.iter().map(|b| b.0).max().unwrap_or(0);
        wire_us = wire_us.max(f64::from(size) * 8.0 / (slowest_port * 1e3));
        for d in used(other).into_iter().filter(|d| mine.contains(d)) {
            if devs[d].kind == DeviceKind::Nvme {
                let mut kinds = Vec::new();
                if other.read_pct > 0 {
                    kinds.push(IoKind::Read);
                }
                if other.read_pct < 100 {
                    kinds.push(IoKind::Write);
                }
                for kind in kinds {
                    // The device serves an IO one buffer-sized piece at a time.
                    let piece = size.min(sc.target.buffer_size);
                    device_us = device_us.max(devs[d].cost.cost(kind, piece, false) / 1e3);
                }
            }
        }
    }
    device_us + wire_us
}
