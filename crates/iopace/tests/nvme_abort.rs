//! NVMe/TCP Abort against SPDK's `abort` example (issue 37): the admin
//! queue's Abort reaches its IO command on whichever reactor serves the IO
//! queue (the servers here run 2). A command still waiting (in the pacer,
//! for buffers, for its data) is aborted: it completes with Command Abort
//! Requested and the Abort's dword 0 bit 0 is clear; one at the device is
//! not. Every buffer comes back. Skips without an SPDK build.

mod common;

use std::time::Duration;

use common::nvme::*;
use common::{free_port, run, Server, MALLOC_EXPORTS};

/// What SPDK's abort example counted.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    io_completed: u64,
    io_failed: u64,
    submitted: u64,
    success: u64,
    unsuccessful: u64,
    failed: u64,
}

fn counts(out: &str) -> Counts {
    let after = |key: &str| -> u64 {
        out.split(key)
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key:?} in\n{out}"))
    };
    Counts {
        io_completed: after("I/O completed: "),
        io_failed: after(", failed: "),
        submitted: after("abort submitted "),
        success: after("success "),
        unsuccessful: after("unsuccessful "),
        // The abort line goes on: "unsuccessful N, failed M".
        failed: after(&format!("unsuccessful {}, failed ", after("unsuccessful "))),
    }
}

/// Runs the abort example; its counts. Every Abort completes without
/// error, and every IO that failed is one an Abort ended.
fn abort_run(spdk: &std::path::Path, shm: u32, port: u16, args: &[&str]) -> Counts {
    let o = run(
        tool(spdk, "build/examples/abort", shm_id(shm))
            .args(["-c", "0x1", "-r", &trid(port, NQN)])
            .args(args),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(o.status.success(), "abort {args:?}:\n{out}");
    assert!(
        !out.contains("no tcp_req is found"),
        "a stray completion\n{out}"
    );
    let c = counts(&out);
    eprintln!("spdk abort {args:?}: {c:?}");
    assert!(c.submitted > 0 && c.io_completed > 0, "{out}");
    assert_eq!(c.success + c.unsuccessful, c.submitted, "{out}");
    assert_eq!(c.failed, 0, "Aborts that failed\n{out}");
    assert_eq!(c.io_failed, c.success, "IO failed but not aborted\n{out}");
    c
}

/// Default pacing, reads at QD 16 with an Abort for every 4th, then every
/// IO aborted at QD 32 (its admin queue of 40 entries, QD / interval + 8,
/// is taken). The malloc device is fast: most IOs are done before their
/// Abort comes. Identify advertises the Abort and AER limits kept.
#[test]
fn spdk_abort_and_the_limits_identify_advertises() {
    let Some(spdk) = spdk() else { return };
    let (server, port) = nvme_server();
    let o = run(
        tool(&spdk, "build/bin/spdk_nvme_identify", shm_id(6)).args(["-r", &trid(port, NQN)]),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(
        out.contains("Abort Command Limit:                   4"),
        "{out}"
    );
    assert!(
        out.contains("Async Event Request Limit:             4"),
        "{out}"
    );
    abort_run(
        &spdk,
        6,
        port,
        &[
            "-q", "16", "-o", "4096", "-w", "randread", "-t", "2", "-a", "4",
        ],
    );
    abort_run(
        &spdk,
        6,
        port,
        &["-q", "32", "-a", "1", "-t", "1", "-o", "4096", "-w", "read"],
    );
    server.assert_quiescent(256);
    assert!(!server.log_text().contains("panicked"));
}

/// A slow rate pacer (one 4 KiB credit per ms) holds IOs: the Abort sent
/// after every READ and every WRITE finds most still paced and aborts
/// them; the pool is whole at the end.
#[test]
fn spdk_abort_ends_ios_the_pacer_holds() {
    let Some(spdk) = spdk() else { return };
    let port = free_port();
    let extra = format!("nvme_tcp = [\"127.0.0.1:{port}\"]");
    let body =
        format!("{MALLOC_EXPORTS}\n[pacing]\nmode = \"rate\"\nperiod_us = 1000\ncredit = 4096\n");
    let server = Server::start_full(
        &extra,
        &body,
        "num_shared_buffers = 256\nbuf_cache_size = 8",
    );
    for w in ["randread", "write"] {
        let c = abort_run(
            &spdk,
            7,
            port,
            &["-q", "16", "-o", "4096", "-w", w, "-t", "2", "-a", "1"],
        );
        assert!(c.success > c.submitted / 4, "{w}: few aborted: {c:?}");
    }
    server.assert_quiescent(256);
    assert!(!server.log_text().contains("panicked"));
}
