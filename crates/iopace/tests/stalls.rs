//! Clients that stall hold nobody else hostage: two writers per reactor that
//! send a 32 MiB WRITE header and 100 bytes of payload and go silent, and a
//! client that sends READs and never reads a reply. A fresh client's 4 KiB
//! write then read must still be answered promptly.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

const REACTORS: usize = 2;

fn body(mode: &str) -> String {
    format!("{MALLOC_EXPORTS}\n[pacing]\nmode = \"{mode}\"\n")
}

/// A connection that sends a 32 MiB WRITE with 100 bytes of its payload.
fn stalled_writer(server: &Server) -> RawClient<UnixStream> {
    let mut c = raw_unix(server, "default");
    c.request(1, 0, 1, 0, 32 << 20);
    c.s.write_all(&[0x5a; 100]).expect("first payload bytes");
    c
}

/// A connection that sends READs until the server stops taking them, and
/// never reads a reply.
fn deaf_reader(server: &Server) -> RawClient<UnixStream> {
    let c = raw_unix(server, "default");
    c.s.set_write_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut c = c;
    let mut burst = Vec::new();
    for cookie in 0..4096u64 {
        burst.extend_from_slice(&REQ_MAGIC.to_be_bytes());
        burst.extend_from_slice(&0u16.to_be_bytes());
        burst.extend_from_slice(&0u16.to_be_bytes()); // READ
        burst.extend_from_slice(&cookie.to_be_bytes());
        burst.extend_from_slice(&((cookie % 256) << 17).to_be_bytes());
        burst.extend_from_slice(&(128u32 << 10).to_be_bytes());
    }
    // Blocks once the server holds this client back; that is the point.
    let _ = c.s.write_all(&burst);
    c
}

/// Time for a fresh client's 4 KiB write then read, both answered.
fn probe(server: &Server) -> Duration {
    let mut c = raw_unix(server, "default");
    let data = [0x3cu8; 4096];
    let t = Instant::now();
    c.request(1, 0, 7, 64 << 20, 4096);
    c.s.write_all(&data).expect("payload");
    assert_eq!(c.simple_reply(), (0, 7));
    c.request(0, 0, 8, 64 << 20, 4096);
    assert_eq!(c.simple_reply(), (0, 8));
    assert_eq!(c.read_exact(4096), data);
    t.elapsed()
}

fn stalled_clients_delay_nobody(mode: &str) {
    let server = Server::start_with(
        &body(mode),
        "num_shared_buffers = 1024\nbuf_cache_size = 32",
    );
    let writers: Vec<_> = (0..2 * REACTORS).map(|_| stalled_writer(&server)).collect();
    let deaf = deaf_reader(&server);
    // Let the stalls settle into whatever they hold.
    std::thread::sleep(Duration::from_millis(300));
    let times: Vec<Duration> = (0..3).map(|_| probe(&server)).collect();
    let best = times.iter().min().copied().unwrap_or_default();
    assert!(
        best <= Duration::from_millis(100),
        "{mode}: a fresh client's write+read took {times:?} beside stalled clients"
    );
    drop(writers);
    drop(deaf);
    // Their buffers all come back once they are gone.
    server.assert_quiescent(1024);
    let (status, log) = server.stop();
    assert!(status.success(), "{mode}: {log}");
}

#[test]
fn stalled_clients_delay_nobody_under_buffers() {
    stalled_clients_delay_nobody("buffers");
}

/// Under `auto`, even with per-flow windows, each reactor's window (1 MiB
/// here) is filled by its two stalled writers' payload pieces: the pacer has
/// released them (each holds its buffer, waiting for bytes that never come)
/// and they never complete, so a fresh client's IO waits in the pacer.
/// Passing needs those pieces out of the shared window: counted only against
/// their own flow, or paced when their payload is in rather than before.
#[test]
#[ignore = "stalled writers' released payload pieces fill the auto window"]
fn stalled_clients_delay_nobody_under_auto() {
    stalled_clients_delay_nobody("auto");
}
