//! A reactor on an 8-entry ring: 64 WRITEs then 64 READs of a file bdev
//! at once need far more SQEs than its submission queue holds. They wait
//! in its backlog while completions are reaped, and every one is served
//! with the right data.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use config::{PollMode, SpliceMode};
use pace::pacer::{PacedDevice, PacerGroup};
use pool::SharedPool;

use super::{Accepted, Msg, Reactor, ReactorHandle, ReactorSettings};
use crate::engine::Timeouts;
use crate::exports::Catalog;

const N: u64 = 64;

fn start(dir: &std::path::Path) -> (Arc<ReactorHandle>, std::thread::JoinHandle<()>) {
    let text = format!(
        "[[bdev]]\nname = \"disk\"\nkind = \"file\"\npath = \"{}/disk.img\"\nsize = \"16MiB\"\n\
         [[export]]\nname = \"default\"\nbdev = \"disk\"\n",
        dir.display()
    );
    let loaded = crate::Config::parse(&text, "t.toml").expect("config");
    let catalog = Arc::new(Catalog::build(&loaded).expect("catalog"));
    let pool = SharedPool::new(loaded.config.buffers.pool()).expect("pool");
    let devices: Vec<PacedDevice> = (catalog.devices.iter())
        .map(|d| PacedDevice {
            cost: d.cost,
            qos: d.qos,
        })
        .collect();
    let pacers = PacerGroup::new(&catalog.pacing, &devices, 1, pool.buffer_size(), 0);
    let settings = ReactorSettings {
        id: 0,
        pacers: Arc::new(pacers),
        max_requests: 256,
        drain_timeout: Duration::from_secs(5),
        timeouts: Timeouts {
            handshake: 10_000_000_000,
            idle: 60_000_000_000,
            payload: 10_000_000_000,
        },
        poll: PollMode::Interrupt,
        poll_spin: Duration::ZERO,
        batch_wait: Duration::ZERO,
        splice: SpliceMode::Off,
        send_buffers: Default::default(),
        ring_entries: 8,
    };
    let handle = ReactorHandle::new().expect("eventfd");
    let h = handle.clone();
    // A reactor lives on its thread (it holds raw pointers into its memory).
    let thread = std::thread::spawn(move || {
        let reactor = Reactor::new(settings, h, catalog, pool, Instant::now()).expect("reactor");
        reactor.run().expect("reactor runs");
    });
    (handle, thread)
}

/// Fixed newstyle, no zeroes, GO for the default export.
fn handshake(c: &mut UnixStream) {
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).expect("greeting");
    c.write_all(&3u32.to_be_bytes()).expect("flags");
    let mut go = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
    go.extend(7u32.to_be_bytes());
    go.extend(6u32.to_be_bytes());
    go.extend([0u8; 6]);
    c.write_all(&go).expect("GO");
    loop {
        let mut h = [0u8; 20];
        c.read_exact(&mut h).expect("option reply");
        let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
        let mut data = vec![0u8; len as usize];
        c.read_exact(&mut data).expect("option data");
        if u32::from_be_bytes(h[12..16].try_into().expect("4 bytes")) == 1 {
            return;
        }
    }
}

fn request(cmd: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut m = 0x2560_9513u32.to_be_bytes().to_vec();
    m.extend(0u16.to_be_bytes());
    m.extend(cmd.to_be_bytes());
    m.extend(cookie.to_be_bytes());
    m.extend(offset.to_be_bytes());
    m.extend(len.to_be_bytes());
    m
}

/// A simple reply's (error, cookie).
fn reply(c: &mut UnixStream) -> (u32, u64) {
    let mut r = [0u8; 16];
    c.read_exact(&mut r).expect("reply");
    let error = u32::from_be_bytes(r[4..8].try_into().expect("4 bytes"));
    (
        error,
        u64::from_be_bytes(r[8..16].try_into().expect("8 bytes")),
    )
}

#[test]
fn a_tiny_ring_serves_many_ios_at_once_through_its_backlog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (handle, thread) = start(dir.path());
    let (mut c, theirs) = UnixStream::pair().expect("socketpair");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    // Counted in, as the acceptor does.
    handle.conns.fetch_add(1, Ordering::Relaxed);
    handle.send(Msg::NewConn(Accepted {
        fd: OwnedFd::from(theirs),
        peer: "test".into(),
        port: None,
    }));
    handshake(&mut c);
    let mut burst = Vec::new();
    for i in 0..N {
        burst.extend(request(1, i, i * 4096, 4096));
        burst.extend(vec![i as u8 + 1; 4096]);
    }
    c.write_all(&burst).expect("writes");
    let mut done: Vec<(u32, u64)> = (0..N).map(|_| reply(&mut c)).collect();
    done.sort();
    assert_eq!(done, (0..N).map(|i| (0, i)).collect::<Vec<_>>());
    let reads: Vec<u8> = (0..N)
        .flat_map(|i| request(0, 100 + i, i * 4096, 4096))
        .collect();
    c.write_all(&reads).expect("reads");
    for _ in 0..N {
        let (error, cookie) = reply(&mut c);
        assert_eq!(error, 0);
        let mut data = vec![0u8; 4096];
        c.read_exact(&mut data).expect("data");
        assert!(
            data.iter().all(|&b| u64::from(b) == cookie - 100 + 1),
            "{cookie}"
        );
    }
    let (tx, rx) = mpsc::channel();
    handle.send(Msg::Stats(tx));
    let stats = rx.recv_timeout(Duration::from_secs(5)).expect("stats");
    assert!(stats.sq_backlogged > 0, "the backlog was used");
    drop(c);
    handle.send(Msg::Shutdown);
    thread.join().expect("reactor thread");
}
