//! The oracle on small scenarios worked out by hand.

use super::*;
use crate::parse;

const GBPS: f64 = 1e9 / 8.0;

/// A scenario from its port, device and host tables, with one `auto` run
/// (tenants as given).
fn scenario(body: &str, tenants: &str) -> Scenario {
    let text = format!(
        "name = \"t\"\nqds = [32]\nduration_ms = 100\nwarmup_ms = 0\n\
         [target]\nreactors = 1\nbuffer_size = 131072\nnum_shared_buffers = 1024\n\
         ddio_budget_mib = 1000\nddio_slope = 0\nddio_floor = 1\n{body}\n\
         [[runs]]\nlabel = \"auto\"\npacing = {{ mode = \"auto\"{tenants} }}\n"
    );
    parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn ideal_of(sc: &Scenario, qd: u32) -> Ideal {
    bound(sc, &sc.runs[0], qd)
}

fn near(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{got} vs {want}"
    );
}

const FAST_DEVICES: &str = "[[devices]]\ncount = 16\nkind = \"delay\"\nlatency_us = 10\n";

/// Tenants 2:1: the weight-2 tenant's host on a 10 GbE link, the weight-1
/// tenant's two hosts on 100 GbE, one 92.4 Gb/s port, delay devices (no
/// device bound). The weight-2 host takes its link; the others split
/// the rest.
#[test]
fn a_tenant_held_by_its_own_link() {
    let body = format!(
        "[[ports]]\nrate_gbps = 92.4\nrtt_us = 10\n{FAST_DEVICES}\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\nlink_gbps = 9.24\ntenant = 0\n\
         [[hosts]]\ncount = 2\nbssplit = [[131072, 1]]\ntenant = 1\n"
    );
    let sc = scenario(
        &body,
        ", tenants = [{ name = \"gold\", weight = 2.0 }, { name = \"bronze\", weight = 1.0 }]",
    );
    let i = ideal_of(&sc, 256);
    near(i.host_bps[0], 9.24 * GBPS);
    near(i.host_bps[1], (92.4 - 9.24) / 2.0 * GBPS);
    near(i.host_bps[2], (92.4 - 9.24) / 2.0 * GBPS);
    assert_eq!(i.tenant, vec![0, 1, 1]);
    assert_eq!(i.limit, vec![Limit::Link, Limit::Port, Limit::Port]);
}

/// One host at QD 1, 128 KiB reads from a 100 us delay device over a
/// 10 us RTT at 92.4 Gb/s: one IO per round trip of 10 + 100 us plus the
/// payload's time on the wire.
#[test]
fn a_qd_bound_host_gets_littles_law() {
    let body = "[[ports]]\nrate_gbps = 92.4\nrtt_us = 10\n\
                [[devices]]\ncount = 1\nkind = \"delay\"\nlatency_us = 100\n\
                [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\n";
    let sc = scenario(body, "");
    let i = ideal_of(&sc, 1);
    let wire = 131072.0 / (92.4 * GBPS);
    let rt = 110e-6 + wire;
    near(i.host_bps[0], 131072.0 / rt);
    near(i.floor_bytes, 131072.0);
    assert_eq!(i.limit, vec![Limit::Qd]);
    // Held by its QD, its QD bound is its rate: no headroom.
    near(i.qd_bps[0], i.host_bps[0]);
    // At QD 4 the port is not reached either: four times the rate.
    near(ideal_of(&sc, 4).host_bps[0], 4.0 * 131072.0 / rt);
}

/// Two hosts on one drive of 1 channel: 4 KiB reads at 100k IOPS and
/// 1 GB/s cost 10 us + 4.096 us each; the drive is the bottleneck and the
/// hosts split it equally.
#[test]
fn a_shared_device_binds() {
    let body = "[[ports]]\nrate_gbps = 92.4\nrtt_us = 10\n\
                [[devices]]\ncount = 1\nkind = \"nvme\"\nlatency_us = 10\n\
                cost = { rbps = 1e9, rseqiops = 1e5, rrandiops = 1e5, wbps = 1e9, wseqiops = 1e5, wrandiops = 1e5 }\n\
                [[hosts]]\ncount = 2\nbssplit = [[4096, 1]]\n";
    let sc = scenario(body, "");
    let i = ideal_of(&sc, 256);
    let iops = 1e9 / (10_000.0 + 4096.0);
    near(i.total_bps(), iops * 4096.0);
    near(i.host_bps[0], i.host_bps[1]);
    assert_eq!(i.limit, vec![Limit::Device, Limit::Device]);
}

/// A 25 Gb/s port shared by a 10 GbE host and a 100 GbE host: 10 and 15.
#[test]
fn a_port_shared_by_unequal_links() {
    let body = format!(
        "[[ports]]\nrate_gbps = 25\nrtt_us = 10\n{FAST_DEVICES}\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\nlink_gbps = 10\n\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\nlink_gbps = 100\n"
    );
    let sc = scenario(&body, "");
    let i = ideal_of(&sc, 256);
    near(i.host_bps[0], 10.0 * GBPS);
    near(i.host_bps[1], 15.0 * GBPS);
    assert_eq!(i.limit, vec![Limit::Link, Limit::Port]);
    // At QD 256 the QD bound is far above either rate.
    assert!(i.qd_bps.iter().zip(&i.host_bps).all(|(q, r)| *q > 10.0 * r));
}

/// Writers load the ingress direction, readers the egress: a reader and
/// a writer on one port each get the whole port.
#[test]
fn reads_and_writes_use_opposite_directions() {
    let body = format!(
        "[[ports]]\nrate_gbps = 40\nrtt_us = 10\n{FAST_DEVICES}\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\n\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\nread_pct = 0\n"
    );
    let sc = scenario(&body, "");
    let i = ideal_of(&sc, 256);
    near(i.host_bps[0], 40.0 * GBPS);
    near(i.host_bps[1], 40.0 * GBPS);
}

/// A port that halves halfway through the measured stretch: the ideal is
/// the mean of the two halves.
#[test]
fn a_port_step_averages_over_time() {
    let body = format!(
        "[[ports]]\nrate_gbps = 40\nrtt_us = 10\nstep = [50, 20.0]\n{FAST_DEVICES}\
         [[hosts]]\ncount = 1\nbssplit = [[131072, 1]]\n"
    );
    let sc = scenario(&body, "");
    near(ideal_of(&sc, 256).host_bps[0], 30.0 * GBPS);
}

/// Two hosts meet at one drive (1 channel, 100k IOPS, 1 GB/s): 4 KiB and
/// 64 KiB reads. Dominant resource fairness gives each half the drive's
/// time, as iocost does, not equal bytes.
#[test]
fn hosts_meeting_at_a_drive_split_its_time() {
    let body = "[[ports]]\nrate_gbps = 92.4\nrtt_us = 10\n\
                [[devices]]\ncount = 1\nkind = \"nvme\"\nlatency_us = 10\n\
                cost = { rbps = 1e9, rseqiops = 1e5, rrandiops = 1e5, wbps = 1e9, wseqiops = 1e5, wrandiops = 1e5 }\n\
                [[hosts]]\ncount = 1\nbssplit = [[4096, 1]]\n\
                [[hosts]]\ncount = 1\nbssplit = [[65536, 1]]\n";
    let sc = scenario(body, "");
    let i = ideal_of(&sc, 1024);
    near(i.host_bps[0], 0.5e9 / 14_096.0 * 4096.0);
    near(i.host_bps[1], 0.5e9 / 75_536.0 * 65536.0);
}

/// A host of QD 2 with 128 KiB and 4 KiB IOs behind a 9.2 Gb/s port (fuzz
/// case 1:76): its IOs meet at the port, where a 128 KiB payload takes
/// 114 us, so alone it carries less than its unloaded bound. The ideal caps it at what it carries alone,
/// and says its QD holds it.
#[test]
fn a_host_is_held_to_what_it_carries_alone() {
    let body = "[[ports]]\nrate_gbps = 9.2\nrtt_us = 100\n\
                [[devices]]\ncount = 2\nkind = \"nvme\"\nlatency_us = 40\nparallel = 4\n\
                cost = { rbps = 1e9, rseqiops = 1e5, rrandiops = 1e5, wbps = 8e8, \
                wseqiops = 8e4, wrandiops = 8e4 }\n\
                [[hosts]]\ncount = 1\nbssplit = [[131072, 2], [4096, 4]]\nread_pct = 70\n";
    let sc = scenario(body, "");
    let unloaded = bound(&sc, &sc.runs[0], 2);
    let run = &sc.runs[0];
    let i = ideal(&sc, run, 2);
    let (hosts, _) = hosts::hosts(&sc, run, 2, 2);
    let alone = alone::rates(&sc, run, 2, &hosts)[0];
    assert!(
        alone < 0.99 * unloaded.host_bps[0],
        "{alone} vs {unloaded:?}"
    );
    near(i.host_bps[0], alone);
    assert_eq!(i.limit, vec![Limit::Qd]);
    // The QD bound stays Little's law's: the headroom is measured from it.
    near(i.qd_bps[0], unloaded.qd_bps[0]);
}

/// A flow alone stops at the first of its cap and its constraints, and
/// the alone cap scales whichever that is in each phase.
#[test]
fn a_solo_flow_stops_at_its_tightest_constraint() {
    let flow = fill::Flow {
        group: 0,
        cap: 10.0,
        loads: vec![(0, 1.0), (1, 0.5)],
    };
    assert_eq!(solo(&flow, &[20.0, 2.0]), (4.0, Some(1)));
    assert_eq!(solo(&flow, &[20.0, 40.0]), (10.0, None));
    let mut phases = vec![
        Phase {
            problem: fill::Problem {
                capacity: vec![20.0, 2.0],
                weights: vec![1.0],
                flows: vec![flow.clone()],
            },
            rtt: vec![0.0],
            share: 0.5,
        },
        Phase {
            problem: fill::Problem {
                capacity: vec![20.0, 40.0],
                weights: vec![1.0],
                flows: vec![flow],
            },
            rtt: vec![0.0],
            share: 0.5,
        },
    ];
    // Unloaded it would average 7; alone it carried 6.3 (90%).
    let held = cap_alone(&mut phases, &[6.3]);
    near(phases[0].problem.flows[0].cap, 3.6);
    near(phases[1].problem.flows[0].cap, 9.0);
    assert_eq!(held, vec![None]);
}
