//! NVMe/TCP against SPDK's initiators used as `nvme_tcp.rs` does not use
//! them: spdk_nvme_identify of every subsystem (512-byte and 4 KiB
//! blocks, read-only) with all the log pages it reads. SPDK comes from
//! `../shared/spdk/build.sh` (cached in `$SPDK_DIR`, default
//! `~/.cache/iopace-spdk-v26.05`); without a finished build the tests say
//! so and skip.

mod common;

use std::time::Duration;

use common::nvme::*;
use common::{free_port, run, Server};

/// Three exports: 512-byte blocks, 4 KiB blocks, and read-only.
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
/// slot. Each namespace's size and LBA format are its export's.
#[test]
fn spdk_identify_reads_every_log_of_every_subsystem() {
    let Some(spdk) = spdk() else { return };
    let (server, port) = server();
    let disc = identify(&spdk, port, DISCOVERY);
    assert!(
        disc.contains("Number of Records:                     3"),
        "{disc}"
    );
    let want = [
        ("default", "131072", "512", "No"),
        ("b4k", "16384", "4096", "No"),
        ("ro", "32768", "512", "Yes"),
    ];
    for (name, lbas, lbads, wp) in want {
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
    }
    let (st, log) = server.stop();
    assert!(st.success() && !log.contains("panicked"), "{log}");
}
