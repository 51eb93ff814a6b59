//! Clients that stall hold nobody else hostage: two writers per reactor that
//! send a 32 MiB WRITE header and 100 bytes of payload and go silent, and a
//! client that sends READs and never reads a reply. A fresh client's 4 KiB
//! write then read must still be answered promptly, over Unix sockets (each
//! client a host of its own to the pacer) and over TCP (all of them one host,
//! 127.0.0.1, whose connections share its window).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

/// A client socket whose writes can be given up on.
trait Stream: Read + Write {
    fn write_timeout(&self, d: Duration);
}

impl Stream for UnixStream {
    fn write_timeout(&self, d: Duration) {
        self.set_write_timeout(Some(d)).expect("timeout");
    }
}

impl Stream for TcpStream {
    fn write_timeout(&self, d: Duration) {
        self.set_write_timeout(Some(d)).expect("timeout");
    }
}

const REACTORS: usize = 2;

fn body(mode: &str) -> String {
    format!("{MALLOC_EXPORTS}\n[pacing]\nmode = \"{mode}\"\n")
}

/// A connection that sends a 32 MiB WRITE with 100 bytes of its payload.
fn stalled_writer<S: Stream>(c: RawClient<S>) -> RawClient<S> {
    let mut c = c;
    c.request(1, 0, 1, 0, 32 << 20);
    c.s.write_all(&[0x5a; 100]).expect("first payload bytes");
    c
}

/// A connection that sends READs until the server stops taking them, and
/// never reads a reply.
fn deaf_reader<S: Stream>(c: RawClient<S>) -> RawClient<S> {
    c.s.write_timeout(Duration::from_millis(500));
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
fn probe<S: Stream>(c: RawClient<S>) -> Duration {
    let mut c = c;
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

fn stalled_clients_delay_nobody<S: Stream>(
    mode: &str,
    connect: impl Fn(&Server, &str) -> RawClient<S>,
) {
    let server = Server::start_with(
        &body(mode),
        "num_shared_buffers = 1024\nbuf_cache_size = 32",
    );
    let writers: Vec<_> = (0..2 * REACTORS)
        .map(|_| stalled_writer(connect(&server, "default")))
        .collect();
    let deaf = deaf_reader(connect(&server, "default"));
    // Let the stalls settle into whatever they hold.
    std::thread::sleep(Duration::from_millis(300));
    let times: Vec<Duration> = (0..3).map(|_| probe(connect(&server, "default"))).collect();
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
    stalled_clients_delay_nobody("buffers", raw_unix);
}

/// Under `auto`, a payload piece waiting for bytes holds only its own
/// connection's window, and a connection that stops draining leaves its
/// host's and the reactor's windows (see `pace::pacer::flows`).
#[test]
fn stalled_clients_delay_nobody_under_auto() {
    stalled_clients_delay_nobody("auto", raw_unix);
}

/// Over TCP every client is the same host (127.0.0.1): the stalled ones must
/// not hold that host's window either.
#[test]
fn stalled_clients_on_one_host_delay_nobody_under_auto() {
    stalled_clients_delay_nobody("auto", raw_tcp);
}
