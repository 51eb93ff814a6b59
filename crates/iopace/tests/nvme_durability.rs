//! NVMe/TCP under kill -9 and abrupt hosts (issue 38), with the bare host
//! of `common::nvme` (no SPDK needed):
//! - durability rounds: in each round a queue writes a region of its own,
//!   half with FUA and half followed by a FLUSH, while two other queues
//!   write elsewhere; the server is killed (SIGKILL) with their writes in
//!   flight, a new one serves the same file, and every region acknowledged
//!   in every round so far reads back as written;
//! - hosts that go mid-IO (reads in the device, writes half sent, IO held
//!   by a stall) leave every buffer back in the pool.

mod common;

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use common::nvme::*;
use common::{file_export, free_port, Server, BIN};
use proto::nvme::cmd::io;
use proto::nvme::pdu::{DataHdr, Pdu};

const ROUNDS: u32 = 3;
/// Bytes of a region, and of a piece (one command).
const REGION: usize = 1 << 20;
const PIECE: usize = 128 << 10;
const REGION_BLOCKS: u32 = (REGION / BLOCK) as u32;
const PIECE_BLOCKS: u32 = (PIECE / BLOCK) as u32;

/// What a round writes at block `lba`: every block names its round and LBA.
fn pattern(round: u32, lba: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    for (i, b) in d.chunks_mut(BLOCK).enumerate() {
        b.fill(0xA0 ^ round as u8);
        b[..4].copy_from_slice(&round.to_le_bytes());
        b[4..8].copy_from_slice(&(lba + i as u32).to_le_bytes());
    }
    d
}

fn serve(body: &str) -> (Server, u16) {
    let port = free_port();
    let extra = format!("nvme_tcp = [\"127.0.0.1:{port}\"]");
    let s = Server::start_full(&extra, body, "num_shared_buffers = 256\nbuf_cache_size = 8");
    (s, port)
}

/// Writes 128 KiB pieces to the upper half from its own queue until the
/// connection goes; how many were acknowledged.
fn background_writer(port: u16, cntlid: u16, qid: u16) -> std::thread::JoinHandle<u32> {
    let mut q = io_queue(port, cntlid, qid);
    std::thread::spawn(move || {
        let data = vec![0xEEu8; PIECE];
        let base = 32 * REGION_BLOCKS + u32::from(qid) * 4 * REGION_BLOCKS;
        for n in 0u32.. {
            let lba = base + (n % 32) * PIECE_BLOCKS;
            if write_blocks(&mut q, (n % 64) as u16, lba, &data, false).is_none() {
                return n;
            }
        }
        unreachable!()
    })
}

#[test]
fn acknowledged_nvme_writes_survive_kill_9_rounds_with_io_in_flight() {
    let (_img, body) = file_export("iopace-it-nvme-durable", "/var/tmp", "64MiB");
    for round in 0..ROUNDS {
        let (server, port) = serve(&body);
        let (_a, cntlid) = admin_queue(port, 0);
        let writers = [2, 3].map(|qid| background_writer(port, cntlid, qid));
        let mut q = io_queue(port, cntlid, 1);
        // Region 2 * round with FUA, region 2 * round + 1 then a FLUSH.
        let (fua, flushed) = (2 * round * REGION_BLOCKS, (2 * round + 1) * REGION_BLOCKS);
        for (cid, at) in (0..8).map(|k| (k as u16, k * PIECE_BLOCKS)) {
            let d = pattern(round, fua + at, PIECE);
            assert_eq!(write_blocks(&mut q, cid, fua + at, &d, true), Some(0));
            let d = pattern(round, flushed + at, PIECE);
            assert_eq!(
                write_blocks(&mut q, cid + 8, flushed + at, &d, false),
                Some(0)
            );
        }
        assert_eq!(flush(&mut q, 20), 0, "FLUSH");
        std::thread::sleep(Duration::from_millis(200));
        drop(server); // SIGKILL, with the writers' IO in flight
        for w in writers {
            assert!(w.join().expect("writer") > 0, "a writer wrote nothing");
        }
        let (server, port) = serve(&body);
        let (_a, cntlid) = admin_queue(port, 0);
        let mut q = io_queue(port, cntlid, 1);
        for r in 0..=round {
            for k in 0..2 * REGION_BLOCKS / PIECE_BLOCKS {
                let lba = 2 * r * REGION_BLOCKS + k * PIECE_BLOCKS;
                let (st, got) = read_blocks(&mut q, k as u16, lba, PIECE);
                assert_eq!(st, 0, "round {round}: READ of round {r}'s LBA {lba}");
                assert!(
                    got == pattern(r, lba, PIECE),
                    "round {round}: round {r}'s data at LBA {lba} was lost"
                );
            }
        }
        assert!(server.stop().0.success());
    }
}

/// Closes a socket with a RST (SO_LINGER 0) rather than a FIN.
fn reset(h: Host) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setting an option on a socket this function owns.
    let rc = unsafe {
        libc::setsockopt(
            h.s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER");
}

/// A queue with 16 READs of 128 KiB in flight (in the device: each takes
/// 20 ms more), and 4 WRITEs of 1 MiB with half their first R2T's data.
fn busy_queue(port: u16, cntlid: u16, qid: u16) -> Host {
    let mut q = io_queue(port, cntlid, qid);
    for cid in 0..16u16 {
        let lba = u32::from(cid) * PIECE_BLOCKS;
        q.send(Pdu::CapsuleCmd(
            rw_sqe(io::READ, cid, lba, PIECE, false),
            &[],
        ));
    }
    for cid in 16..20u16 {
        q.send(Pdu::CapsuleCmd(big_write(cid, u32::from(cid) * 2048), &[]));
    }
    let mut sent = 0;
    while sent < 4 {
        let (t, b) = q.recv();
        assert_ne!(t, 0xFF, "closed");
        if t == 9 {
            let h = DataHdr {
                cccid: u16::from_le_bytes([b[8], b[9]]),
                ttag: u16::from_le_bytes([b[10], b[11]]),
                datao: 0,
                last: false,
                success: false,
            };
            q.send(Pdu::H2CData(h, &[0x5A; 64 << 10]));
            sent += 1;
        }
    }
    q
}

#[test]
fn hosts_gone_mid_io_leave_every_buffer_in_the_pool() {
    let body = "[[bdev]]\nname = \"m0\"\nkind = \"malloc\"\nsize = \"64MiB\"\n\n\
        [[bdev]]\nname = \"slow\"\nkind = \"fault\"\nbase = \"m0\"\nlatency_us = 20000\n\n\
        [[export]]\nname = \"default\"\nbdev = \"slow\"\n";
    let (server, port) = serve(body);
    let (mut a, cntlid) = admin_queue(port, 0);
    for round in 0..3u16 {
        if round == 2 {
            // The device stalls: what is in it is held past the hosts' end.
            let out = Command::new(BIN)
                .args(["rpc", "set_fault", r#"{"bdev":"slow","stall_ms":1000}"#])
                .arg("--rpc")
                .arg(&server.rpc)
                .output()
                .expect("iopace rpc");
            assert!(out.status.success(), "{out:?}");
        }
        let fin = busy_queue(port, cntlid, 2 * round + 1);
        let rst = busy_queue(port, cntlid, 2 * round + 2);
        drop(fin);
        reset(rst);
        server.assert_quiescent(256);
        // The admin queue carries on.
        let ka = proto::nvme::cmd::Sqe::new(proto::nvme::cmd::admin::KEEP_ALIVE, 30 + round);
        assert_eq!(a.command(ka, &[]).0, 0);
    }
    let held = server.rpc("get_faults");
    assert!(held[0]["held"].as_u64() > Some(0), "{held:#}");
    let (st, log) = server.stop();
    assert!(st.success(), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
