//! Small random targets for the fault fuzzer, and the faults each gets.
//! Small on purpose: a few hosts, reactors and drives, short runs, and
//! pools that run dry, so that a case runs in milliseconds and faults land
//! on every state a request passes through (waiting for a slot, in the
//! pacer, waiting for a buffer, filling, at the device, sending).

use std::fmt::Write;

use pace::pacer::{Mode, PacingConfig};
use rand::rngs::SmallRng;
use rand::Rng;
use server::engine::Timeouts;

use crate::fuzz::gen::rng;
use crate::world::FaultPlan;

const SPEEDS: [f64; 4] = [1.0, 10.0, 25.0, 100.0];
const SIZES: [u32; 7] = [4096, 8192, 16384, 65536, 131072, 262144, 1 << 20];
/// (latency us, rbps, riops, wbps, wiops, channels): fast and slow drives.
const DRIVES: [(f64, [f64; 4], usize); 3] = [
    (10.0, [2.8e9, 550e3, 2.0e9, 450e3], 8),
    (80.0, [1.0e9, 100e3, 0.8e9, 80e3], 4),
    (500.0, [0.2e9, 5e3, 0.15e9, 4e3], 1),
];

fn pick<T: Copy>(r: &mut SmallRng, from: &[T]) -> T {
    from[r.gen_range(0..from.len())]
}

/// Case `index` of `seed`: a scenario (TOML) and the faults it gets.
pub fn case(seed: u64, index: u64) -> (String, FaultPlan) {
    // Another stream than the performance fuzzer's case of the same index.
    let mut r = rng(seed ^ 0x0fa0_17ed, index);
    let reactors = r.gen_range(1..=3usize);
    let tenants = pick(&mut r, &[0usize, 0, 1, 2]);
    let buffer_size = pick(&mut r, &[65536u32, 131072]);
    let mut s = format!(
        "name = \"faults {seed}:{index}\"\n\
         description = \"iopace sim --faults {seed} --index {index}\"\n\
         seed = {index}\nduration_ms = 1\nwarmup_ms = 0\nqds = [{}]\n\n\
         [target]\nreactors = {reactors}\nbuffer_size = {buffer_size}\n\
         num_shared_buffers = {}\nbuf_cache_size = {}\n\
         ddio_budget_mib = 12\nddio_slope = 0.075\nddio_floor = 0.6\n",
        pick(&mut r, &[1u32, 2, 4, 8, 16, 32]),
        // The simulator's hosts need a whole IO's buffers at once.
        pick(&mut r, &[2u32, 4, 8, 16, 64, 256]).max((1 << 20) / buffer_size),
        r.gen_range(0..=2u32),
    );
    if r.gen_bool(0.5) {
        let n = pick(&mut r, &[1u32, 4, 32]);
        let _ = writeln!(s, "num_small_buffers = {n}\nsmall_buffer_size = 8192");
    }
    let ports = r.gen_range(1..=2usize);
    for _ in 0..ports {
        let speed = pick(&mut r, &SPEEDS[1..]) * 0.924;
        let rtt = pick(&mut r, &[10.0, 50.0, 200.0]);
        let _ = writeln!(s, "\n[[ports]]\nrate_gbps = {speed:.1}\nrtt_us = {rtt}");
    }
    let devices = drives(&mut r, &mut s);
    for g in 0..r.gen_range(1..=3usize) {
        hosts(
            &mut r,
            &mut s,
            devices,
            ports,
            if tenants == 0 { 0 } else { g % tenants },
        );
    }
    let first = modes(&tenant_list(tenants));
    let mode = &first[r.gen_range(0..first.len())].1;
    let _ = write!(s, "\n[[runs]]\nlabel = \"faults\"\npacing = {mode}\n");
    (
        s,
        plan(
            &mut r,
            seed ^ index,
            first.into_iter().map(|m| m.0).collect(),
        ),
    )
}

/// 1-3 groups of one or two drives; returns how many.
fn drives(r: &mut SmallRng, s: &mut String) -> usize {
    let mut total = 0;
    for _ in 0..r.gen_range(1..=3) {
        let count = r.gen_range(1..=2usize);
        total += count;
        let (latency, c, channels) = pick(r, &DRIVES);
        let kind = if r.gen_bool(0.2) { "delay" } else { "nvme" };
        let _ = write!(
            s,
            "\n[[devices]]\ncount = {count}\nkind = \"{kind}\"\nlatency_us = {latency}\n\
             parallel = {channels}\n\
             cost = {{ rbps = {:e}, rseqiops = {:e}, rrandiops = {:e}, wbps = {:e}, wseqiops = {:e}, wrandiops = {:e} }}\n",
            c[0], c[1], c[1], c[2], c[3], c[3]
        );
    }
    total
}

/// A group of 1-3 hosts: sizes (some past the buffer size, so streamed
/// and in pieces), reads and writes, a link, devices, connections.
fn hosts(r: &mut SmallRng, s: &mut String, devices: usize, ports: usize, tenant: usize) {
    let split: Vec<String> = (0..r.gen_range(1..=3))
        .map(|_| format!("[{}, {}]", pick(r, &SIZES), r.gen_range(1..=4)))
        .collect();
    let _ = write!(
        s,
        "\n[[hosts]]\ncount = {}\nbssplit = [{}]\nread_pct = {}\ntenant = {tenant}\nport = {}\n",
        r.gen_range(1..=3),
        split.join(", "),
        pick(r, &[100u32, 70, 50, 0]),
        r.gen_range(0..ports),
    );
    if r.gen_bool(0.5) {
        let _ = writeln!(s, "link_gbps = {:.1}", pick(r, &SPEEDS) * 0.924);
    }
    if r.gen_bool(0.3) {
        s.push_str("one_connection = true\n");
    }
    if devices > 1 && r.gen_bool(0.5) {
        let d = r.gen_range(0..devices);
        let _ = writeln!(s, "devices = [{d}]");
    }
}

fn tenant_list(tenants: usize) -> String {
    let list: Vec<String> = (0..tenants)
        .map(|t| format!("{{ name = \"t{t}\", weight = {}.0 }}", t + 1))
        .collect();
    match list.is_empty() {
        true => String::new(),
        false => format!(", tenants = [{}]", list.join(", ")),
    }
}

#[derive(serde::Deserialize)]
struct Run {
    pacing: PacingConfig,
}

/// The pacing modes a case switches among, as configs and as TOML.
fn modes(tenants: &str) -> Vec<(PacingConfig, String)> {
    [
        "mode = \"none\"",
        "mode = \"buffers\"",
        "mode = \"rate\", period_us = 20.0, credit = 262144",
        "mode = \"auto\"",
    ]
    .iter()
    .map(|m| {
        let text = format!("{{ {m}{tenants} }}");
        let cfg = toml::from_str::<Run>(&format!("pacing = {text}"))
            .unwrap_or_else(|e| panic!("pacing {text}: {e}"))
            .pacing;
        (cfg, text)
    })
    .collect()
}

/// How often each fault strikes in this case: dense, so that a run of a
/// few hundred simulated milliseconds takes thousands.
fn plan(r: &mut SmallRng, seed: u64, modes: Vec<PacingConfig>) -> FaultPlan {
    let ms = 1_000_000;
    debug_assert!(modes.iter().any(|m| m.mode == Mode::Auto));
    FaultPlan {
        seed,
        device_error: pick(r, &[0.05, 0.2, 0.5]),
        device_stall: pick(r, &[0.02, 0.1, 0.3]),
        stall_max: pick(r, &[ms / 5, 2 * ms, 20 * ms, 100 * ms]),
        pause_max: pick(r, &[ms / 10, ms, 20 * ms]),
        flap_max: pick(r, &[20_000, 100_000, ms]),
        // Resets and pauses lose or hold IOs: rarer than flaps and
        // pacing switches, so that most IOs still run their course.
        gaps: [
            pick(r, &[0, ms / 2, 2 * ms]),
            pick(r, &[0, ms / 2, 2 * ms]),
            pick(r, &[50_000, 200_000, ms]),
            pick(r, &[20_000, 100_000, ms / 2]),
            pick(r, &[0, 0, 40 * ms]),
        ],
        modes,
        run_for: pick(r, &[50, 100, 200]) * ms,
        timeouts: Timeouts {
            handshake: 10_000 * ms,
            idle: pick(r, &[10, 50, 200]) * ms,
            payload: pick(r, &[5, 30, 200]) * ms,
        },
        drain_timeout: pick(r, &[10, 50, 200]) * ms,
        engine_delay_us: pick(r, &[0, 0, 20, 500]),
    }
}
