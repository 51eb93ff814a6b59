//! Text report for `iopace stats`, in the spirit of the seed's
//! "Detailed NVMf target statistics".

use std::fmt::Write;

use serde::Deserialize;
use server::stats::ReactorStats;

#[derive(Deserialize)]
pub struct StatsReply {
    pub reactors: Vec<ReactorStats>,
}

pub fn render(reply: &StatsReply) -> String {
    let mut s = String::new();
    let total_conns: u64 = reply.reactors.iter().map(|r| r.connections).sum();
    let _ = writeln!(
        s,
        "iopace target: {} reactors, {} connections",
        reply.reactors.len(),
        total_conns
    );
    for r in &reply.reactors {
        let _ = writeln!(s, "Reactor {} (up {:.1} s)", r.reactor, r.uptime_s);
        let _ = writeln!(
            s,
            "  Connections: {} now, {} total; loop iterations {}",
            r.connections, r.connections_total, r.loop_iterations
        );
        let _ = writeln!(
            s,
            "  Socket bytes in/out: {} / {}; protocol errors {}, rejected requests {}",
            r.bytes_in, r.bytes_out, r.protocol_errors, r.rejected_requests
        );
        let ops: Vec<String> = r
            .io
            .iter()
            .filter(|(_, c)| c.ios > 0)
            .map(|(name, c)| format!("{name} {} ({:.1} MiB)", c.ios, c.bytes as f64 / 1048576.0))
            .collect();
        let _ = writeln!(
            s,
            "  IOs: {}",
            if ops.is_empty() {
                "none".into()
            } else {
                ops.join(", ")
            }
        );
        // Lifecycle order, not alphabetical.
        let order = ["NEW", "PACING", "NEED_BUFFER", "EXECUTING", "TRANSFER"];
        let states: Vec<String> = order
            .iter()
            .map(|k| format!("{k} {}", r.req_states.get(*k).copied().unwrap_or(0)))
            .collect();
        let _ = writeln!(
            s,
            "  Requests in flight: {} [{}]",
            r.requests_in_flight,
            states.join(", ")
        );
        let b = &r.buffers;
        let _ = writeln!(
            s,
            "  Bufs in-flight: {} now, {:.1} avg, {} max ({:.2} MiB avg, {:.2} MiB max); waits {}; cached {}; pool free {}",
            b.in_use, b.in_use_avg, b.in_use_max, b.in_use_avg_mib, b.in_use_max_mib, b.waits, b.cached, b.pool_free
        );
        let p = &r.pacer;
        if let Some(mode) = p["mode"].as_str() {
            let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
            let _ = writeln!(
                s,
                "  Pacer {mode}: calls, polls, ios: {}, {}, {}; period {:.2} us; rate {:.2} Gb/s; window {:.2} MiB; queued {}",
                f("calls"),
                f("polls"),
                f("ios"),
                f("period_us"),
                f("rate_bps") * 8.0 / 1e9,
                f("window_bytes") / 1048576.0,
                f("queued")
            );
            let _ = writeln!(
                s,
                "  Pacer bytes in flight: {:.2} MiB now, {:.2} avg, {:.2} max; min latency {:.1} us; vrate {:.2}",
                f("bytes_in_flight") / 1048576.0,
                f("bytes_in_flight_avg") / 1048576.0,
                f("bytes_in_flight_max") / 1048576.0,
                f("min_latency_us"),
                f("vrate")
            );
            if let Some(tenants) = p["tenants"].as_array().filter(|t| t.len() > 1) {
                for t in tenants {
                    let _ = writeln!(
                        s,
                        "    Tenant {}: weight {}, share {:.3}, {:.1} MiB, vtime lag {:.0}, queued {}",
                        t["name"].as_str().unwrap_or("?"),
                        t["weight"],
                        t["share"].as_f64().unwrap_or(0.0),
                        t["usage_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
                        t["vtime_lag"].as_f64().unwrap_or(0.0),
                        t["queued"]
                    );
                }
            }
        }
        if r.delayed_completions > 0 {
            let _ = writeln!(
                s,
                "  Completions held by delay bdevs: {}",
                r.delayed_completions
            );
        }
        for e in &r.exports {
            let l = &e.latency;
            if l.count == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "  Export \"{}\": {} IOs, lat us avg {:.1} p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
                e.name, l.count, l.mean_us, l.p50_us, l.p99_us, l.p999_us, l.max_us
            );
        }
    }
    s
}
