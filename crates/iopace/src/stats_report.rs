//! Text report for `iopace stats`, laid out as an NVMe-oF
//! target's detailed statistics: totals first, then one row per export,
//! then each reactor. Sizes are MiB, rates MiB/s, latencies microseconds.

use std::fmt::Write;

use admin::stats::{ExportStats, ReactorStats, StatsReply, RECENT_WINDOW_S};
use pace::pacer::PacerStats;

fn mib(bytes: impl Into<f64>) -> f64 {
    bytes.into() / 1048576.0
}

/// "read 12 (0.05 MiB), flush 3": commands with data show their MiB.
fn io_list<'a>(io: impl Iterator<Item = (&'a String, u64, u64)>) -> String {
    let ops: Vec<String> = io
        .filter(|(_, ios, _)| *ios > 0)
        .map(|(name, ios, bytes)| match name.as_str() {
            "read" | "write" => format!("{name} {ios} ({:.1} MiB)", mib(bytes as f64)),
            _ => format!("{name} {ios}"),
        })
        .collect();
    if ops.is_empty() {
        "none".into()
    } else {
        ops.join(", ")
    }
}

pub fn render(reply: &StatsReply) -> String {
    let mut s = String::new();
    render_totals(&mut s, &reply.reactors);
    render_ports(&mut s, &reply.ports);
    render_exports(&mut s, &reply.reactors);
    for r in &reply.reactors {
        render_reactor(&mut s, r);
    }
    s
}

fn render_totals(s: &mut String, reactors: &[ReactorStats]) {
    let sum = |f: fn(&ReactorStats) -> u64| reactors.iter().map(f).sum::<u64>();
    let up = reactors.iter().map(|r| r.uptime_s).fold(0.0, f64::max);
    let _ = writeln!(
        s,
        "iopace target: {} reactors, up {up:.1} s, {} connections now ({} NVMe/TCP), {} accepted",
        reactors.len(),
        sum(|r| r.connections),
        sum(|r| r.nvme_connections),
        sum(|r| r.connections_total)
    );
    let mut io: std::collections::BTreeMap<&String, (u64, u64)> = Default::default();
    for (name, c) in reactors.iter().flat_map(|r| &r.io) {
        let e = io.entry(name).or_default();
        e.0 += c.ios;
        e.1 += c.bytes;
    }
    let _ = writeln!(
        s,
        "Total IOs: {}",
        io_list(io.iter().map(|(n, (i, b))| (*n, *i, *b)))
    );
    let _ = writeln!(
        s,
        "Total socket: {:.1} MiB in, {:.1} MiB out; protocol errors {}, rejected requests {}; requests in flight {}; buffers in use {}, pool free {}",
        mib(sum(|r| r.bytes_in) as f64),
        mib(sum(|r| r.bytes_out) as f64),
        sum(|r| r.protocol_errors),
        sum(|r| r.rejected_requests),
        sum(|r| r.requests_in_flight),
        sum(|r| r.buffers.in_use),
        reactors.first().map_or(0, |r| r.buffers.pool_free)
    );
}

/// The ports the pacers measure (listeners with `gbps`), if any.
fn render_ports(s: &mut String, ports: &[admin::stats::PortStats]) {
    for p in ports {
        let _ = writeln!(
            s,
            "Port {} ({}, {} Gb/s): {:.1} MiB sent, {:.1} MiB received",
            p.port,
            p.name,
            p.gbps,
            mib(p.sent_bytes as f64),
            mib(p.received_bytes as f64)
        );
    }
}

/// One row per export, summed over reactors. Percentiles cannot be summed,
/// so the row shows the worst reactor's.
fn render_exports(s: &mut String, reactors: &[ReactorStats]) {
    let mut rows: Vec<(String, Vec<&ExportStats>)> = Vec::new();
    for e in reactors.iter().flat_map(|r| &r.exports) {
        match rows.iter_mut().find(|(n, _)| *n == e.name) {
            Some((_, v)) => v.push(e),
            None => rows.push((e.name.clone(), vec![e])),
        }
    }
    let _ = writeln!(
        s,
        "Exports (latency us; \"last\": the last {}-{} s, worst reactor):",
        RECENT_WINDOW_S,
        2 * RECENT_WINDOW_S
    );
    let _ = writeln!(
        s,
        "  {:<16} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>10}",
        "export", "IOs", "MiB", "errors", "mean", "last p50", "last p99", "last p99.9"
    );
    for (name, per_reactor) in rows {
        let ios: u64 = per_reactor.iter().map(|e| e.ios).sum();
        let bytes: u64 = per_reactor.iter().map(|e| e.bytes).sum();
        let errors: u64 = per_reactor.iter().map(|e| e.errors).sum();
        let count: u64 = per_reactor.iter().map(|e| e.latency.count).sum();
        let total_us: f64 = per_reactor
            .iter()
            .map(|e| e.latency.mean_us * e.latency.count as f64)
            .sum();
        let mean = if count == 0 {
            0.0
        } else {
            total_us / count as f64
        };
        let worst =
            |f: fn(&ExportStats) -> f64| per_reactor.iter().map(|e| f(e)).fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "  {:<16} {:>10} {:>10.1} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>10.1}",
            name,
            ios,
            mib(bytes as f64),
            errors,
            mean,
            worst(|e| e.recent.p50_us),
            worst(|e| e.recent.p99_us),
            worst(|e| e.recent.p999_us)
        );
    }
}

fn render_reactor(s: &mut String, r: &ReactorStats) {
    let _ = writeln!(s, "Reactor {}", r.reactor);
    let _ = writeln!(
        s,
        "  Connections: {} now, {} accepted; loop iterations {}; gathering {}",
        r.connections,
        r.connections_total,
        r.loop_iterations,
        if r.gathering { "on" } else { "off" }
    );
    let _ = writeln!(
        s,
        "  Socket: {:.1} MiB in ({:.1} straight into buffers), {:.1} MiB out; protocol errors {}, rejected requests {}",
        mib(r.bytes_in as f64),
        mib(r.bytes_in_direct as f64),
        mib(r.bytes_out as f64),
        r.protocol_errors,
        r.rejected_requests
    );
    let _ = writeln!(
        s,
        "  IOs: {}",
        io_list(r.io.iter().map(|(n, c)| (n, c.ios, c.bytes)))
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
    render_pacer(s, &r.pacer);
    if r.delayed_completions > 0 {
        let _ = writeln!(
            s,
            "  Completions held by delay bdevs: {}",
            r.delayed_completions
        );
    }
}

/// The depth in effect where it is not the learned one (a trial), and the
/// devices held at depth 1 beside a QD 1 client.
fn in_effect(p: &PacerStats) -> String {
    let mut s = String::new();
    if p.depth_in_effect > 0.0 && (p.depth_in_effect - p.depth).abs() > 1e-9 {
        s = format!(" ({:.2} in effect)", p.depth_in_effect);
    }
    if p.held_devices > 0 {
        let _ = write!(s, " ({} at 1 for a QD 1 client)", devices(p.held_devices));
    }
    s
}

fn devices(n: usize) -> String {
    if n == 1 {
        "1 device".into()
    } else {
        format!("{n} devices")
    }
}

fn render_pacer(s: &mut String, p: &PacerStats) {
    let mode = format!("{:?}", p.mode).to_lowercase();
    let _ = writeln!(
        s,
        "  Pacer {mode}: calls, polls, ios: {}, {}, {}; period {:.2} us; rate {:.1} MiB/s; window {:.2} MiB; queued {}",
        p.calls,
        p.polls,
        p.ios,
        p.period_us,
        mib(p.rate_bps),
        mib(p.window_bytes as f64),
        p.queued
    );
    let _ = writeln!(
        s,
        "  Pacer bytes in flight: {:.2} MiB now, {:.2} avg, {:.2} max; min latency {:.1} us; depth {:.2}{}; vrate {:.2}",
        mib(p.bytes_in_flight as f64),
        mib(p.bytes_in_flight_avg),
        mib(p.bytes_in_flight_max as f64),
        p.min_latency_us,
        p.depth,
        in_effect(p),
        p.vrate
    );
    if p.tenants.len() > 1 {
        for t in &p.tenants {
            let _ = writeln!(
                s,
                "    Tenant {}: weight {}, share {:.3}, {:.1} MiB, vtime lag {:.0}, queued {}",
                t.name,
                t.weight,
                t.share,
                mib(t.usage_bytes as f64),
                t.vtime_lag,
                t.queued
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_line_shows_its_typed_fields_in_mib() {
        let mut r = ReactorStats::default();
        r.pacer.mode = pace::pacer::Mode::Rate;
        r.pacer.window_bytes = 3 << 20;
        r.pacer.rate_bps = 2.0 * 1048576.0;
        let text = render(&StatsReply {
            reactors: vec![r],
            ..Default::default()
        });
        assert!(text.contains("Pacer rate:"), "{text}");
        assert!(text.contains("rate 2.0 MiB/s; window 3.00 MiB"), "{text}");
    }

    #[test]
    fn the_depth_in_effect_shows_where_it_is_not_the_learned_one() {
        let mut r = ReactorStats::default();
        r.pacer.depth = 5.0625;
        r.pacer.depth_in_effect = 7.59375;
        let trial = render(&StatsReply {
            reactors: vec![r.clone()],
            ..Default::default()
        });
        assert!(trial.contains("depth 5.06 (7.59 in effect);"), "{trial}");
        r.pacer.depth_in_effect = 5.0625;
        r.pacer.held_devices = 2;
        let held = render(&StatsReply {
            reactors: vec![r.clone()],
            ..Default::default()
        });
        assert!(
            held.contains("depth 5.06 (2 devices at 1 for a QD 1 client);"),
            "{held}"
        );
        r.pacer.held_devices = 0;
        let learned = render(&StatsReply {
            reactors: vec![r],
            ..Default::default()
        });
        assert!(learned.contains("depth 5.06;"), "{learned}");
    }

    #[test]
    fn the_measured_ports_show_what_they_carried() {
        let port = admin::stats::PortStats {
            port: 1,
            name: "eth0".into(),
            gbps: 25.0,
            sent_bytes: 3 << 20,
            received_bytes: 1 << 19,
        };
        let text = render(&StatsReply {
            reactors: vec![ReactorStats::default()],
            ports: vec![port],
        });
        assert!(
            text.contains("Port 1 (eth0, 25 Gb/s): 3.0 MiB sent, 0.5 MiB received"),
            "{text}"
        );
    }
}
