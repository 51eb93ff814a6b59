//! NVMe/TCP against SPDK's initiators used as `nvme_tcp.rs` does not use
//! them: spdk_nvme_identify of every subsystem (512-byte and 4 KiB
//! blocks, read-only) with all the log pages it reads, spdk_nvme_perf
//! with a short keep-alive timeout. SPDK comes from
//! `../shared/spdk/build.sh` (cached in `$SPDK_DIR`, default
//! `~/.cache/iopace-spdk-v26.05`); without a finished build the tests say
//! so and skip. The raw-protocol test (I/O keeps a controller alive)
//! needs nothing but the binary.

mod common;

use std::time::{Duration, Instant};

use common::nvme::*;
use common::{free_port, run, Server};
use proto::nvme::cmd::{admin, fctype, Sqe};

/// Four exports: 512-byte blocks, 4 KiB blocks, read-only, and a null
/// device (reads 0xA5).
const EXPORTS: &str = r#"
[[bdev]]
name = "m0"
kind = "malloc"
size = "64MiB"

[[bdev]]
name = "m4k"
kind = "malloc"
size = "64MiB"
block_size = "4KiB"

[[bdev]]
name = "ro0"
kind = "malloc"
size = "16MiB"

[[bdev]]
name = "n0"
kind = "null"
size = "16MiB"

[[export]]
name = "default"
bdev = "m0"

[[export]]
name = "b4k"
bdev = "m4k"

[[export]]
name = "ro"
bdev = "ro0"
read_only = true

[[export]]
name = "null"
bdev = "n0"
"#;

fn server() -> (Server, u16) {
    let port = free_port();
    let extra = format!("nvme_tcp = [\"127.0.0.1:{port}\"]");
    let s = Server::start_full(&extra, EXPORTS, "num_shared_buffers = 256");
    (s, port)
}

fn identify(spdk: &std::path::Path, port: u16, nqn: &str) -> String {
    let o = run(
        tool(spdk, "build/bin/spdk_nvme_identify", shm_id(4)).args(["-r", &trid(port, nqn)]),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(o.status.success(), "identify {nqn}:\n{out}");
    out
}

/// Every log page spdk_nvme_identify reads of an I/O controller is
/// there: Firmware Slot Information (03h) is mandatory (NVMe 1.4, Get Log
/// Page; SPDK's target serves it), and Identify's FRMW names its one
/// slot. Each namespace's size and LBA format are its export's, and DLFEAT
/// claims zeros after a deallocate only where the device gives them.
#[test]
fn spdk_identify_reads_every_log_of_every_subsystem() {
    let Some(spdk) = spdk() else { return };
    let (server, port) = server();
    let disc = identify(&spdk, port, DISCOVERY);
    assert!(
        disc.contains("Number of Records:                     4"),
        "{disc}"
    );
    // The null device reads its pattern after a deallocate, not zeros.
    let want = [
        ("default", "131072", "512", "No", "All 0x00"),
        ("b4k", "16384", "4096", "No", "All 0x00"),
        ("ro", "32768", "512", "Yes", "All 0x00"),
        ("null", "32768", "512", "No", "Unknown"),
    ];
    for (name, lbas, lbads, wp, dealloc) in want {
        let nqn = format!("nqn.2026-11.io.iopace:{name}");
        let out = identify(&spdk, port, &nqn);
        assert!(!out.contains("failed"), "{nqn}:\n{out}");
        let fw = format!("Slot 1 Firmware Revision:    {}", env!("CARGO_PKG_VERSION"));
        assert!(out.contains(&fw), "{nqn}:\n{out}");
        let size = format!("Size (in LBAs):                        {lbas} ");
        assert!(out.contains(&size), "{nqn}:\n{out}");
        let fmt = format!("LBA Format #00: Data Size: {lbads:>5}");
        assert!(out.contains(&fmt), "{nqn}:\n{out}");
        let ro = format!("Namespace Write Protected:             {wp}");
        assert!(out.contains(&ro), "{nqn}:\n{out}");
        let dl = format!("Deallocated Read Value:                {dealloc}");
        assert!(out.contains(&dl), "{nqn}:\n{out}");
    }
    let (st, log) = server.stop();
    assert!(st.success() && !log.contains("panicked"), "{log}");
}

/// Traffic based keep alive: a host whose I/O queue keeps taking commands
/// stays connected though its admin queue sends no Keep Alive within the
/// timeout (its I/O restarts the timer, as Identify's CTRATT says); once
/// the I/O stops too, the controller goes within the timeout and a bit.
#[test]
fn io_traffic_keeps_a_controller_alive() {
    let (server, port) = server();
    let (mut a, cntlid) = admin_queue(port, 1000);
    let mut q = io_queue(port, cntlid, 1);
    let t = Instant::now();
    let mut cid = 0;
    while t.elapsed() < Duration::from_millis(2500) {
        cid += 1;
        assert_eq!(read_blocks(&mut q, cid, 0, BLOCK).0, 0, "read {cid}");
        std::thread::sleep(Duration::from_millis(150));
    }
    let log = server.log_text();
    assert!(!log.contains("controller gone"), "{log}");
    let t = Instant::now();
    assert_eq!(a.recv().0, 0xFF, "admin queue not closed");
    assert_eq!(q.recv().0, 0xFF, "IO queue not closed");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// spdk_nvme_perf with a 1 s keep-alive timeout sends its Keep Alive only
/// when its admin poller wakes, once a second: late by a little each
/// time. Its I/O keeps the controller alive (SPDK's target rounds the
/// timeout up to 10 s instead), so no I/O fails.
#[test]
fn spdk_perf_with_a_short_keep_alive_timeout() {
    let Some(spdk) = spdk() else { return };
    let (server, port) = server();
    let o = run(
        tool(&spdk, "build/bin/spdk_nvme_perf", shm_id(5))
            .args(["-c", "0x1", "-t", "4", "-k", "1000", "-q", "16"])
            .args(["-o", "4096", "-w", "randread", "-r", &trid(port, NQN)]),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("completed with error"), "{out}");
    let log = server.log_text();
    assert!(!log.contains("controller gone"), "{log}");
}

/// A Property Set or Get of CC (0x14) or CSTS (0x1C): its dword 0.
fn property(a: &mut Host, cid: u16, set: Option<u32>, ofst: u32) -> u32 {
    let mut p = Sqe::new(admin::FABRICS, cid);
    p.set_cdw(11, ofst);
    p.0[4] = match set {
        Some(v) => {
            p.set_cdw(12, v);
            fctype::PROPERTY_SET
        }
        None => fctype::PROPERTY_GET,
    };
    let (st, dw0) = a.command(p, &[]);
    assert_eq!(st, 0, "property {ofst:#x}");
    dw0
}

/// Polls CSTS until `mask` bits read `want`.
fn wait_csts(a: &mut Host, mask: u32, want: u32) {
    let t = Instant::now();
    for cid in 100.. {
        if property(a, cid, None, 0x1C) & mask == want {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "CSTS never {want:#x}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Controller lifecycle with an I/O queue connected: a reset (CC.EN 1 to
/// 0) is done (CSTS.RDY 0) only once that queue's connection is closed,
/// so an I/O queue of the same id connected right after it is enabled
/// again is the only one, and stays; a shutdown (CC.SHN) likewise reports
/// complete once the queue is gone. Then the host leaves and connects
/// again with the same host NQN.
#[test]
fn reset_and_shutdown_with_an_io_queue_connected() {
    let (server, port) = server();
    let (mut a, cntlid) = admin_queue(port, 0);
    let mut q1 = io_queue(port, cntlid, 1);
    assert_eq!(read_blocks(&mut q1, 1, 0, BLOCK).0, 0);
    property(&mut a, 3, Some(0x0046_0000), 0x14);
    wait_csts(&mut a, 1, 0);
    property(&mut a, 4, Some(0x0046_0001), 0x14);
    let mut q2 = io_queue(port, cntlid, 1);
    // Closed by the target (not the 10 s read timeout): it served no more.
    let t = Instant::now();
    assert_eq!(q1.recv().0, 0xFF, "the old I/O queue is closed");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(read_blocks(&mut q2, 2, 0, BLOCK).0, 0, "the new one serves");
    property(&mut a, 5, Some(0x0046_4001), 0x14);
    wait_csts(&mut a, 0b1100, 0b1000);
    assert_eq!(q2.recv().0, 0xFF, "shut down: the I/O queue is closed");
    drop(a);
    let (mut b, _) = admin_queue(port, 0);
    assert_eq!(b.command(Sqe::new(admin::KEEP_ALIVE, 9), &[]).0, 0);
    let log = server.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
