//! `[server] metrics`: an HTTP endpoint serving the reactors' statistics in
//! the OpenMetrics text format (which Prometheus scrapes), encoded by
//! `prometheus-client`. Each scrape takes a fresh `get_stats` snapshot, so
//! the reactors keep their counters and nothing is sampled in between.
//! One thread serves scrapes one at a time, each bounded by short timeouts.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::reactor::ReactorHandle;
use crate::stats::{ReactorStats, LATENCY_BUCKETS_S};

/// Labels of one sample.
type Labels = Vec<(&'static str, String)>;

/// The statistics of one scrape.
#[derive(Debug)]
struct Snapshot(Vec<ReactorStats>);

/// Binds the metrics address and serves scrapes on a background thread.
pub fn spawn(addr: &str, reactors: Vec<Arc<ReactorHandle>>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    tracing::info!(
        "metrics on http://{}/metrics",
        listener
            .local_addr()
            .map_or(addr.to_string(), |a| a.to_string())
    );
    std::thread::Builder::new()
        .name("iopace-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = serve_scrape(stream, &reactors) {
                    tracing::debug!("metrics scrape: {e}");
                }
            }
        })?;
    Ok(())
}

fn serve_scrape(mut stream: TcpStream, reactors: &[Arc<ReactorHandle>]) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let (status, content_type, body) = if line.starts_with(b"GET /metrics ") {
        let body = render(crate::rpc::collect_stats(reactors));
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        )
    } else {
        ("404 Not Found", "text/plain", "try GET /metrics\n".into())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The OpenMetrics text of one snapshot.
fn render(stats: Vec<ReactorStats>) -> String {
    let mut registry = Registry::with_prefix("iopace");
    registry.register_collector(Box::new(Snapshot(stats)));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::error!("encoding metrics: {e}");
    }
    out
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, u64)],
) -> std::fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(*v).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        if labels.is_empty() {
            ConstGauge::new(*v).encode(metric.encode_family(&())?)?;
        } else {
            ConstGauge::new(*v).encode(metric.encode_family(labels)?)?;
        }
    }
    Ok(())
}

/// A label value as the text format needs it: prometheus-client writes
/// values as given, and export and tenant names come from the config.
fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn reactor_label(r: &ReactorStats) -> Labels {
    vec![("reactor", r.reactor.to_string())]
}

/// One sample per reactor.
fn per_reactor<T>(stats: &[ReactorStats], f: impl Fn(&ReactorStats) -> T) -> Vec<(Labels, T)> {
    stats.iter().map(|r| (reactor_label(r), f(r))).collect()
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        self.encode_reactors(&mut enc)?;
        self.encode_ios(&mut enc)?;
        self.encode_exports(&mut enc)?;
        self.encode_pacer(&mut enc)
    }
}

impl Snapshot {
    fn encode_reactors(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let conns = per_reactor(s, |r| r.connections as f64);
        gauge(
            enc,
            "connections",
            "Open connections, NBD and NVMe/TCP.",
            &conns,
        )?;
        let nvme = per_reactor(s, |r| r.nvme_connections as f64);
        gauge(
            enc,
            "nvme_connections",
            "Open NVMe/TCP connections (queues), also counted in connections.",
            &nvme,
        )?;
        let gathering = per_reactor(s, |r| f64::from(u8::from(r.gathering)));
        gauge(
            enc,
            "reactor_gathering",
            "1 while a busy reactor's waits gather completions.",
            &gathering,
        )?;
        let accepted = per_reactor(s, |r| r.connections_total);
        counter(
            enc,
            "connections_accepted",
            "Connections accepted, NBD and NVMe/TCP.",
            &accepted,
        )?;
        let mut socket = Vec::new();
        for r in s {
            for (dir, v) in [("in", r.bytes_in), ("out", r.bytes_out)] {
                let mut l = reactor_label(r);
                l.push(("direction", dir.into()));
                socket.push((l, v));
            }
        }
        counter(enc, "socket_bytes", "Bytes moved on NBD sockets.", &socket)?;
        let errors = per_reactor(s, |r| r.protocol_errors);
        counter(
            enc,
            "protocol_errors",
            "Connections closed for protocol errors.",
            &errors,
        )?;
        let rejected = per_reactor(s, |r| r.rejected_requests);
        counter(
            enc,
            "rejected_requests",
            "Requests refused before any IO.",
            &rejected,
        )?;
        self.encode_requests(enc)
    }

    fn encode_requests(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let mut states = Vec::new();
        for r in s {
            for (state, n) in &r.req_states {
                let mut l = reactor_label(r);
                l.push(("state", state.clone()));
                states.push((l, *n as f64));
            }
        }
        gauge(
            enc,
            "requests",
            "Requests in flight by lifecycle state.",
            &states,
        )?;
        let b = |f: fn(&ReactorStats) -> f64| per_reactor(s, f);
        gauge(
            enc,
            "buffers_in_use",
            "Data buffers held by requests.",
            &b(|r| r.buffers.in_use as f64),
        )?;
        gauge(
            enc,
            "buffers_in_use_bytes",
            "Bytes of the data buffers held by requests (small and large).",
            &b(|r| r.buffers.in_use_bytes as f64),
        )?;
        gauge(
            enc,
            "buffers_cached",
            "Buffers in the reactor's cache.",
            &b(|r| r.buffers.cached as f64),
        )?;
        let free = s.first().map_or(0.0, |r| r.buffers.pool_free as f64);
        gauge(
            enc,
            "buffers_pool_free",
            "Buffers free in the shared pool.",
            &[(vec![], free)],
        )?;
        let waits = per_reactor(s, |r| r.buffers.waits);
        counter(
            enc,
            "buffer_waits",
            "Requests that waited for buffers.",
            &waits,
        )
    }

    fn encode_ios(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let (mut ios, mut bytes) = (Vec::new(), Vec::new());
        for r in &self.0 {
            for (op, c) in &r.io {
                let mut l = reactor_label(r);
                l.push(("op", op.clone()));
                ios.push((l.clone(), c.ios));
                if op == "read" || op == "write" {
                    bytes.push((l, c.bytes));
                }
            }
        }
        counter(enc, "ios", "Replies sent, by command.", &ios)?;
        counter(enc, "io_bytes", "Data bytes read and written.", &bytes)
    }

    fn encode_exports(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut by_export: Vec<(String, u64, u64, u64, f64, Vec<u64>)> = Vec::new();
        for e in self.0.iter().flat_map(|r| &r.exports) {
            let i = match by_export.iter().position(|x| x.0 == e.name) {
                Some(i) => i,
                None => {
                    by_export.push((
                        e.name.clone(),
                        0,
                        0,
                        0,
                        0.0,
                        vec![0; LATENCY_BUCKETS_S.len()],
                    ));
                    by_export.len() - 1
                }
            };
            let x = &mut by_export[i];
            x.1 += e.ios;
            x.2 += e.bytes;
            x.3 += e.errors;
            x.4 += e.latency_sum_s;
            for (sum, b) in x.5.iter_mut().zip(&e.buckets) {
                *sum += b;
            }
        }
        let label = |name: &String| vec![("export", escaped(name))];
        let ios: Vec<_> = by_export.iter().map(|x| (label(&x.0), x.1)).collect();
        counter(enc, "export_ios", "Replies sent per export.", &ios)?;
        let bytes: Vec<_> = by_export.iter().map(|x| (label(&x.0), x.2)).collect();
        counter(
            enc,
            "export_bytes",
            "Data bytes read and written per export.",
            &bytes,
        )?;
        let errors: Vec<_> = by_export.iter().map(|x| (label(&x.0), x.3)).collect();
        counter(
            enc,
            "export_errors",
            "Replies with an error per export.",
            &errors,
        )?;
        let mut metric = enc.encode_descriptor(
            "export_latency_seconds",
            "Request latency, header received to reply sent, per export.",
            None,
            MetricType::Histogram,
        )?;
        for (name, count, _, _, sum, cumulative) in &by_export {
            let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_S
                .iter()
                .zip(cumulative)
                .map(|(le, c)| (*le, *c))
                .collect();
            buckets.push((f64::MAX, *count));
            // prometheus-client takes per-bucket counts and sums them itself.
            for i in (1..buckets.len()).rev() {
                // Cumulative counts of one histogram, and the total last.
                debug_assert!(buckets[i].1 >= buckets[i - 1].1, "{name}: buckets go down");
                buckets[i].1 -= buckets[i - 1].1;
            }
            let labels = label(name);
            metric
                .encode_family(&labels)?
                .encode_histogram::<()>(*sum, *count, &buckets, None)?;
        }
        Ok(())
    }

    fn encode_pacer(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        gauge(
            enc,
            "pacer_window_bytes",
            "Bytes the pacer lets in flight.",
            &per_reactor(s, |r| r.pacer.window_bytes as f64),
        )?;
        gauge(
            enc,
            "pacer_depth",
            "How many times its pipe-sized windows auto lets in flight.",
            &per_reactor(s, |r| r.pacer.depth),
        )?;
        gauge(
            enc,
            "pacer_depth_in_effect",
            "The depth auto's windows take now (a trial's step).",
            &per_reactor(s, |r| r.pacer.depth_in_effect),
        )?;
        gauge(
            enc,
            "pacer_depth_held_devices",
            "Devices whose windows keep depth 1 beside a client that sends one IO at a time.",
            &per_reactor(s, |r| r.pacer.held_devices as f64),
        )?;
        gauge(
            enc,
            "pacer_bytes_in_flight",
            "Bytes released by the pacer and not yet done.",
            &per_reactor(s, |r| r.pacer.bytes_in_flight as f64),
        )?;
        gauge(
            enc,
            "pacer_rate_bytes_per_second",
            "Delivery rate the window is sized for.",
            &per_reactor(s, |r| r.pacer.rate_bps),
        )?;
        gauge(
            enc,
            "pacer_period_seconds",
            "Effective pacing period.",
            &per_reactor(s, |r| r.pacer.period_us / 1e6),
        )?;
        gauge(
            enc,
            "pacer_queued",
            "IOs waiting in the pacer.",
            &per_reactor(s, |r| r.pacer.queued as f64),
        )?;
        gauge(
            enc,
            "pacer_vrate",
            "Lowest device vrate (1: the cost model's rate).",
            &per_reactor(s, |r| r.pacer.vrate),
        )?;
        let mut usage = Vec::new();
        for r in s {
            for t in &r.pacer.tenants {
                let mut l = reactor_label(r);
                l.push(("tenant", escaped(&t.name)));
                usage.push((l, t.usage_bytes));
            }
        }
        counter(enc, "tenant_bytes", "Bytes released per tenant.", &usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{ExportStats, OpCount};

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let mut r = ReactorStats {
            reactor: 1,
            connections: 2,
            gathering: true,
            ..ReactorStats::default()
        };
        r.buffers.in_use = 3;
        r.buffers.in_use_bytes = 2 * 8192 + 131072;
        r.io.insert(
            "read".into(),
            OpCount {
                ios: 5,
                bytes: 20480,
            },
        );
        r.exports.push(ExportStats {
            name: "disk \"a\"".into(),
            ios: 5,
            bytes: 20480,
            latency_sum_s: 0.001,
            buckets: vec![1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5],
            ..ExportStats::default()
        });
        let text = render(vec![r]);
        assert!(
            text.contains("iopace_connections{reactor=\"1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("iopace_reactor_gathering{reactor=\"1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("iopace_buffers_in_use_bytes{reactor=\"1\"} 147456"),
            "{text}"
        );
        assert!(
            text.contains("iopace_ios_total{reactor=\"1\",op=\"read\"} 5"),
            "{text}"
        );
        assert!(
            text.contains(
                "iopace_export_latency_seconds_bucket{le=\"0.000025\",export=\"disk \\\"a\\\"\"} 1"
            ) || text.contains(
                "iopace_export_latency_seconds_bucket{export=\"disk \\\"a\\\"\",le=\"0.000025\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("iopace_export_latency_seconds_count{export=\"disk \\\"a\\\"\"} 5"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
