//! Listeners that declare their wire's capacity (`gbps`) are ports the
//! pacer measures: each connection's bytes count on the port its listener
//! is on, and `get_stats` shows them. Real clients (qemu-io over NBD, a
//! bare NVMe/TCP host) on four listeners: two ports, one listener the
//! pacer does not know, and an NVMe/TCP listener naming an NBD listener's
//! port.

mod common;

use std::time::{Duration, Instant};

use common::nvme::{admin_queue, io_queue, read_blocks};
use common::{free_port, qemu_io, require, Server, MALLOC_EXPORTS};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// Each port's (name, gbps, sent bytes, received bytes) in `get_stats`.
fn ports(server: &Server) -> Vec<(String, f64, u64, u64)> {
    let stats = server.rpc("get_stats");
    let list = stats["ports"].as_array().cloned().unwrap_or_default();
    list.iter()
        .enumerate()
        .map(|(i, p)| {
            assert_eq!(p["port"].as_u64(), Some(i as u64), "{p}");
            let n = |k: &str| p[k].as_u64().unwrap_or(u64::MAX);
            (
                p["name"].as_str().unwrap_or("?").to_string(),
                p["gbps"].as_f64().unwrap_or(0.0),
                n("sent_bytes"),
                n("received_bytes"),
            )
        })
        .collect()
}

/// Waits until the ports' byte counts satisfy `ok` (a reply's bytes are
/// counted when its send completes, just after the client has them).
fn wait_for(server: &Server, what: &str, ok: impl Fn(&[(u64, u64)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let bytes: Vec<(u64, u64)> = ports(server).iter().map(|p| (p.2, p.3)).collect();
        if ok(&bytes) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: ports carried {bytes:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_count_on_the_port_of_the_listener_they_came_in_on() {
    require("qemu-io", "qemu-utils");
    let (a, b, c, nvme) = (free_port(), free_port(), free_port(), free_port());
    let tcp = format!(
        "[{{ addr = \"127.0.0.1:{a}\", gbps = 25 }}, \"127.0.0.1:{c}\",\n\
         {{ addr = \"127.0.0.1:{b}\", gbps = 10, port = \"wire-b\" }}]"
    );
    let extra = format!("nvme_tcp = [{{ addr = \"127.0.0.1:{nvme}\", port = \"wire-b\" }}]");
    let buffers = "num_shared_buffers = 256\nbuf_cache_size = 8";
    let server = Server::start_listening(&tcp, a, &extra, MALLOC_EXPORTS, buffers);
    let names: Vec<(String, f64)> = ports(&server).into_iter().map(|p| (p.0, p.1)).collect();
    assert_eq!(
        names,
        [
            (format!("127.0.0.1:{a}"), 25.0),
            ("wire-b".to_string(), 10.0)
        ]
    );
    let uri = |port: u16| format!("nbd://127.0.0.1:{port}/default");
    let limit = Duration::from_secs(30);
    qemu_io(&uri(a), &["read 0 1M"], limit);
    wait_for(&server, "1 MiB read on port 0", |p| {
        p[0].0 >= MIB && p[1] == (0, 0)
    });
    qemu_io(&uri(b), &["write -P 7 0 512k"], limit);
    wait_for(&server, "512 KiB written on port 1", |p| {
        p[1].1 >= MIB / 2 && p[0].1 == 0
    });
    let before = ports(&server);
    // A listener without `gbps`: the pacer does not know its port.
    qemu_io(&uri(c), &["read 0 1M", "write -P 9 1M 256k"], limit);
    let (_admin, cntlid) = admin_queue(nvme, 0);
    let mut q = io_queue(nvme, cntlid, 1);
    let (status, data) = read_blocks(&mut q, 1, 0, 64 << 10);
    assert_eq!(status, 0, "NVMe/TCP read");
    assert!(data.iter().all(|&x| x == 7), "port B's write");
    wait_for(&server, "64 KiB read over NVMe/TCP on port 1", |p| {
        p[1].0 >= before[1].2 + (64 << 10)
    });
    let after = ports(&server);
    assert_eq!((after[0].2, after[0].3), (before[0].2, before[0].3));
    assert_eq!(after[1].3, before[1].3, "the unknown port's write counted");
    assert_eq!(
        after[1].2,
        before[1].2 + (64 << 10),
        "only the NVMe/TCP read"
    );
    let reply = server.rpc_call("get_stats", Value::Null);
    assert!(reply.get("error").is_none(), "{reply}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}
