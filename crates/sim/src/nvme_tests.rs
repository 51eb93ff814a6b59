//! Hosts that speak NVMe/TCP to the simulated target.

use super::*;
use crate::world::Sim;

/// Two NVMe/TCP hosts beside one NBD host, 2 reactors, 4 drives: reads
/// and writes of 4 KiB (in-capsule), 128 KiB and 1 MiB (by R2T, in 8
/// H2CData PDUs).
const MIXED: &str = r#"
name = "nvme"
seed = 3
duration_ms = 20
warmup_ms = 5
qds = [8]
[target]
reactors = 2
buffer_size = 131072
num_shared_buffers = 512
ddio_budget_mib = 4
ddio_slope = 0.075
ddio_floor = 0.6
[[ports]]
rate_gbps = 10
rtt_us = 10
[[devices]]
count = 4
kind = "nvme"
latency_us = 20
[[hosts]]
count = 2
bssplit = [[4096, 2], [131072, 2], [1048576, 1]]
read_pct = 50
protocol = "nvme-tcp"
[[hosts]]
count = 1
bssplit = [[131072, 1]]
read_pct = 50
[[runs]]
label = "auto"
pacing = { mode = "auto" }
"#;

#[test]
fn nvme_tcp_hosts_read_and_write_and_give_every_buffer_back() {
    let sc = parse(MIXED, "mixed.toml").expect("parses");
    for qd in [8, 300, 64, 128] {
        let mut sim = Sim::new(&sc, &sc.runs[0], qd);
        sim.run_events();
        let row = sim.row(qd);
        assert!(
            row.per_group_gbps[0] > 1.0 && row.per_group_gbps[1] > 0.5,
            "QD {qd}: both protocols move data: {row:?}"
        );
        assert!(sim.finish(), "QD {qd}: every IO answered");
        assert_eq!(sim.nvme_errors(), &[] as &[String]);
        assert_eq!(sim.nvme_outstanding(), (0, 0), "QD {qd}");
        assert_eq!(sim.in_use_bytes(), 0, "QD {qd}: every buffer back");
        for e in sim.engines() {
            assert_eq!(e.requests_in_use(), 0);
            assert_eq!(e.buffers_in_use(), 0);
        }
    }
}

#[test]
fn a_bad_protocol_names_file_line_and_field() {
    let text = MIXED.replace("protocol = \"nvme-tcp\"", "protocol = \"nvme\"");
    let e = parse(&text, "x.toml").expect_err("no such protocol");
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(25), Some("protocol")),
        "{e}"
    );
    assert!(e.to_string().starts_with("x.toml:25: "), "{e}");
}

#[test]
fn an_io_past_the_targets_mdts_is_refused_for_nvme_tcp_hosts() {
    // 16 buffers of 128 KiB: MDTS is a quarter of the pool, 512 KiB.
    let text = MIXED.replace("num_shared_buffers = 512", "num_shared_buffers = 16");
    let e = parse(&text, "x.toml").expect_err("1 MiB past MDTS");
    assert_eq!(
        e.field.as_deref(),
        Some("runs[0].num_shared_buffers"),
        "{e}"
    );
    assert!(e.message.contains("MDTS, 524288 bytes"), "{e}");
    let nbd = text.replace("protocol = \"nvme-tcp\"\n", "");
    assert!(parse(&nbd, "x.toml").is_ok(), "NBD hosts have no MDTS");
}
