//! Random scenarios over the whole space the pacer must hold in: host
//! counts, unequal links and RTTs, ports, reactors, drives fast and slow
//! (some whose cost the pacer is not told), sizes, reads and writes,
//! queue depths, tenants (one at QD 1 at times), connections per host,
//! and ports that step mid-run. Each is TOML text, so a failing case is
//! a file `iopace sim FILE` reruns.

use std::fmt::Write;

use pace::pacer::Mode;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Ethernet speeds, Gb/s; a link's payload rate is 92.4% of it.
const SPEEDS: [f64; 8] = [1.0, 10.0, 25.0, 40.0, 50.0, 100.0, 200.0, 400.0];
const PAYLOAD: f64 = 0.924;
const RTTS_US: [f64; 8] = [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0];
const SIZES: [u32; 7] = [4096, 8192, 16384, 65536, 131072, 262144, 1 << 20];
const QDS: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096];
/// Share of host groups that speak NVMe/TCP, and their stream's key.
const NVME_SHARE: f64 = 0.15;
const NVME_STREAM: u64 = 0x6e76_6d65_2d74_6370;
/// Outstanding IOs a case may hold in all: keeps a case's run short.
const MAX_OUTSTANDING: u32 = 16384;

/// Three kinds of drive: (name, latency us, cost model as rbps, riops,
/// wbps, wiops, channels).
const DRIVES: [(&str, f64, [f64; 4], usize); 3] = [
    ("fast", 10.0, [2.8e9, 550e3, 2.0e9, 450e3], 8),
    ("mid", 80.0, [1.0e9, 100e3, 0.8e9, 80e3], 4),
    ("slow", 2000.0, [0.2e9, 5e3, 0.15e9, 4e3], 1),
];

/// The rng of case `index` of `seed`: each case stands alone, so one
/// reruns without the others.
pub fn rng(seed: u64, index: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index)
}

/// The scenario of case `index` of `seed`, as TOML, run under `auto`.
pub fn case(seed: u64, index: u64) -> String {
    case_in(seed, index, Mode::Auto)
}

/// The scenario of case `index` of `seed`, run under `mode`: the same
/// hardware and load whatever the mode, so modes compare case by case.
pub fn case_in(seed: u64, index: u64, mode: Mode) -> String {
    case_as(seed, index, Variant { mode, qd_scale: 1 })
}

/// How a drawn case is run: its pacing mode, and a factor on its QD. The
/// hosts, drives and links are drawn before either applies, so a case
/// compares with itself across variants.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub mode: Mode,
    pub qd_scale: u32,
}

impl Default for Variant {
    /// The case as drawn (a factor of 0 would make every QD 0).
    fn default() -> Variant {
        Variant {
            mode: Mode::default(),
            qd_scale: 1,
        }
    }
}

/// The scenario of case `index` of `seed`, as `variant` says.
pub fn case_as(seed: u64, index: u64, variant: Variant) -> String {
    let Variant { mode, qd_scale } = variant;
    let mut r = rng(seed, index);
    let mut body = String::new();
    let ports = r.gen_range(1..=4usize);
    let reactors = pick(&mut r, &[1usize, 2, 4, 8, 16]);
    let groups = r.gen_range(1..=4usize);
    let tenants = pick(&mut r, &[0usize, 0, 1, 2, 2, 3, 4]);
    let qd = pick(&mut r, &QDS);
    let host_counts = host_counts(&mut r, groups, qd);
    for i in 0..ports {
        let speed = pick(&mut r, &SPEEDS[1..]) * PAYLOAD;
        let rtt = pick(&mut r, &RTTS_US[..4]);
        let _ = writeln!(body, "\n[[ports]]\nrate_gbps = {speed:.1}\nrtt_us = {rtt}");
        if i == 0 && r.gen_bool(0.15) {
            let to = pick(&mut r, &SPEEDS[1..]) * PAYLOAD;
            let _ = writeln!(body, "step = [{STEP_AT}, {to:.1}]");
        }
    }
    let (drive_groups, slowest_us) = devices(&mut r, &mut body);
    let qd1 = tenants >= 2 && r.gen_bool(0.3);
    // The protocol comes from a stream of its own, so a case whose groups
    // all speak NBD is the case this seed drew before NVMe/TCP hosts.
    let mut nvme = rng(seed ^ NVME_STREAM, index);
    let mut longest_rtt = 100.0f64;
    for (g, &count) in host_counts.iter().enumerate() {
        let tenant = if tenants == 0 { 0 } else { g % tenants };
        let at = Group {
            count,
            drive_groups: &drive_groups,
            ports,
            tenant,
            lone_qd1: qd1 && g == 0,
            nvme_tcp: nvme.gen_bool(NVME_SHARE),
        };
        longest_rtt = longest_rtt.max(host_group(&mut r, &mut body, &at));
    }
    run(&mut r, &mut body, tenants, mode);
    // Long enough for dozens of round trips at the slowest drive and RTT.
    let round_trip_ms = (longest_rtt + slowest_us) / 1000.0;
    let measured = ((30.0 * round_trip_ms) as u64).clamp(MEASURED_MS, MAX_MS);
    let draft = Header {
        seed,
        index,
        qd: qd * qd_scale,
        reactors,
        warmup: WARMUP_MS,
        measured,
    };
    let (queued, budget) = queueing_ms(&draft.text(&body));
    // Deep queues at a bottleneck take about `queued` to build: warm up
    // past it and measure as long again, so the run shows the steady state;
    // within the IO budget, so that a case runs in seconds.
    let most = (budget / 2.0).clamp(WARMUP_MS as f64, MAX_MS as f64);
    let warmup = (2.0 * queued).clamp(WARMUP_MS as f64, most) as u64;
    let measured = measured.max((2.0 * queued).min(most) as u64);
    Header {
        warmup,
        measured,
        ..draft
    }
    .text(&body)
}

/// Stands for the time a stepping port changes rate until the stretches
/// are known: halfway through the measured one.
const STEP_AT: &str = "@STEP_AT@";
/// The shortest measured stretch and warm-up, ms, and the longest.
const MEASURED_MS: u64 = 80;
const WARMUP_MS: u64 = 40;
const MAX_MS: u64 = 3000;

/// The longest time, ms, a host's IO takes at its ideal rate (its QD
/// over its rate, by Little's law): how long a queue at its bottleneck
/// takes to build and drain. And how long, ms, the whole scenario takes
/// to carry [`IO_BUDGET`] IOs at the oracle's rates.
fn queueing_ms(text: &str) -> (f64, f64) {
    let Ok(sc) = crate::parse(text, "draft") else {
        return (0.0, MAX_MS as f64);
    };
    let ideal = crate::oracle::bound(&sc, &sc.runs[0], sc.qds[0]);
    let devs = sc.devices.iter().map(|g| g.count).sum();
    let (hosts, _) = crate::hosts::hosts(&sc, &sc.runs[0], sc.qds[0], devs);
    let mut longest = 0.0f64;
    let mut iops = 0.0;
    for (h, &rate) in hosts.iter().zip(&ideal.host_bps) {
        let n: u32 = h.bssplit.iter().map(|b| b.1).sum();
        let bytes: u64 = h
            .bssplit
            .iter()
            .map(|b| u64::from(b.0) * u64::from(b.1))
            .sum();
        let mean = bytes as f64 / f64::from(n.max(1));
        if rate > 0.0 {
            longest = longest.max(1e3 * f64::from(h.qd) * mean / rate);
            iops += rate / mean;
        }
    }
    let budget = if iops > 0.0 {
        1e3 * IO_BUDGET / iops
    } else {
        MAX_MS as f64
    };
    (longest, budget)
}

/// IOs a case's warm-up and measured stretch carry at most, at the
/// oracle's rates (a few seconds of simulation).
const IO_BUDGET: f64 = 1.5e6;

/// Where a host group sits.
struct Group<'a> {
    count: usize,
    /// Each drive group's device indexes.
    drive_groups: &'a [std::ops::Range<usize>],
    ports: usize,
    tenant: usize,
    lone_qd1: bool,
    nvme_tcp: bool,
}

fn pick<T: Copy>(r: &mut SmallRng, from: &[T]) -> T {
    from[r.gen_range(0..from.len())]
}

/// Hosts per group: 1-256 in all, fewer where the QD is deep.
fn host_counts(r: &mut SmallRng, groups: usize, qd: u32) -> Vec<usize> {
    let most = (MAX_OUTSTANDING / qd).clamp(1, 256) as usize;
    let total = if r.gen_bool(0.5) {
        r.gen_range(1..=most.min(8))
    } else {
        r.gen_range(1..=most)
    };
    let mut counts = vec![1usize; groups.min(total)];
    for _ in counts.len()..total {
        let g = r.gen_range(0..counts.len());
        counts[g] += 1;
    }
    counts
}

/// The top of a case's file: its name, stretches and target.
#[derive(Clone, Copy)]
struct Header {
    seed: u64,
    index: u64,
    qd: u32,
    reactors: usize,
    warmup: u64,
    measured: u64,
}

impl Header {
    /// The whole case: this header over `body`, steps placed.
    fn text(&self, body: &str) -> String {
        let Header {
            seed,
            index,
            qd,
            reactors,
            warmup,
            measured,
        } = *self;
        let step = (warmup + measured / 2).to_string();
        format!(
            "name = \"fuzz {seed}:{index}\"\n\
         description = \"iopace sim --fuzz {seed} --index {index}\"\n\
         seed = {index}\nduration_ms = {measured}\nwarmup_ms = {warmup}\nqds = [{qd}]\n\n\
         [target]\nreactors = {reactors}\nbuffer_size = 131072\n\
         num_shared_buffers = 16384\nddio_budget_mib = 12\nddio_slope = 0.075\n\
         ddio_floor = 0.6\n{}",
            body.replace(STEP_AT, &step)
        )
    }
}

/// 1-3 groups of drives, 1-128 in all; returns each group's device
/// indexes and the slowest one's latency, us.
fn devices(r: &mut SmallRng, s: &mut String) -> (Vec<std::ops::Range<usize>>, f64) {
    let mut ranges = Vec::new();
    let groups = r.gen_range(1..=3usize);
    let mut total = 0;
    let mut slowest = 0.0f64;
    for _ in 0..groups {
        let count = pick(r, &[1usize, 1, 2, 4, 8, 16, 32, 64])
            .min(128 - total)
            .max(1);
        ranges.push(total..total + count);
        total += count;
        let (name, latency, c, channels) = pick(r, &DRIVES);
        let kind = if r.gen_bool(0.1) { "delay" } else { "nvme" };
        let latency = latency * pick(r, &[0.5, 1.0, 2.5]);
        slowest = slowest.max(latency);
        let _ = write!(
            s,
            "\n[[devices]]  # {name}\ncount = {count}\nkind = \"{kind}\"\nlatency_us = {latency}\n\
             parallel = {channels}\n\
             cost = {{ rbps = {:e}, rseqiops = {:e}, rrandiops = {:e}, wbps = {:e}, wseqiops = {:e}, wrandiops = {:e} }}\n",
            c[0], c[1], c[1], c[2], c[3], c[3]
        );
        if r.gen_bool(0.25) {
            s.push_str("cost_known = false\n");
        }
        if total >= 128 {
            break;
        }
    }
    (ranges, slowest)
}

/// A group of hosts: sizes, reads, link, RTT, devices, connections.
/// Returns its RTT, us (0: its port's).
fn host_group(r: &mut SmallRng, s: &mut String, g: &Group) -> f64 {
    let Group {
        count,
        drive_groups,
        ports,
        tenant,
        lone_qd1,
        nvme_tcp,
    } = *g;
    let sizes: Vec<u32> = (0..pick(r, &[1usize, 1, 2, 3]))
        .map(|_| pick(r, &SIZES))
        .collect();
    let split: Vec<String> = sizes
        .iter()
        .map(|b| format!("[{b}, {}]", r.gen_range(1..=4)))
        .collect();
    let read = if lone_qd1 {
        100
    } else {
        pick(r, &[100u32, 100, 100, 70, 50, 0])
    };
    let count = if lone_qd1 { 1 } else { count };
    let _ = write!(
        s,
        "\n[[hosts]]\ncount = {count}\nbssplit = [{}]\nread_pct = {read}\ntenant = {tenant}\n",
        split.join(", ")
    );
    if lone_qd1 {
        s.push_str("fixed_qd = 1\n");
    }
    if nvme_tcp {
        s.push_str("protocol = \"nvme-tcp\"\n");
    }
    if r.gen_bool(0.6) {
        let _ = writeln!(s, "link_gbps = {:.1}", pick(r, &SPEEDS) * PAYLOAD);
    }
    let mut rtt = 0.0;
    if r.gen_bool(0.5) {
        rtt = pick(r, &RTTS_US);
        let _ = writeln!(s, "rtt_us = {rtt}");
    }
    if r.gen_bool(0.5) {
        let _ = writeln!(s, "port = {}", r.gen_range(0..ports));
    }
    if r.gen_bool(0.5) {
        s.push_str("one_connection = true\n");
    }
    // A host spreads its IOs evenly over its drives, so it is held to
    // the rate of its busiest one: each group reads all drives of one
    // kind, and drives of one kind carry even loads.
    if drive_groups.len() > 1 || r.gen_bool(0.3) {
        let range = drive_groups[r.gen_range(0..drive_groups.len())].clone();
        let _ = writeln!(s, "devices = {:?}", range.collect::<Vec<_>>());
    }
    rtt
}

/// The one run: `mode`, with 0-4 tenants of weights 1-8.
fn run(r: &mut SmallRng, s: &mut String, tenants: usize, mode: Mode) {
    let list: Vec<String> = (0..tenants)
        .map(|t| format!("{{ name = \"t{t}\", weight = {}.0 }}", r.gen_range(1..=8)))
        .collect();
    let tenants = match list.is_empty() {
        true => String::new(),
        false => format!(", tenants = [{}]", list.join(", ")),
    };
    let mode = mode.name();
    let _ = write!(
        s,
        "\n[[runs]]\nlabel = \"{mode}\"\npacing = {{ mode = \"{mode}\"{tenants} }}\n"
    );
}
