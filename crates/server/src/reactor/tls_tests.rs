//! The reactor's TLS glue against rustls's client, with the ring played by
//! hand: each `TlsOut::Recv` is filled from the client's output, each
//! `TlsOut::Send` fed to the client, and the engine's events recorded.

use std::io::{Read, Write};

use rustls::ClientConnection;

use super::{TlsConns, TlsOut, SEND_CHUNK};
use crate::engine::{ConnId, Received, Sent, TlsOutcome};
use crate::tls::session::tests::{client, pattern, server_config};

const CONN: ConnId = ConnId { index: 3, gen: 1 };

struct Ring {
    tls: TlsConns,
    client: ClientConnection,
    recv: Option<(*mut u8, usize)>,
    send: Option<(*const u8, usize)>,
    /// What the engine heard, in order.
    events: Vec<String>,
    at_client: Vec<u8>,
}

impl Ring {
    fn new() -> Ring {
        let mut r = Ring {
            tls: TlsConns::new(0, Some(server_config())),
            client: client("client-cert.pem"),
            recv: None,
            send: None,
            events: Vec::new(),
            at_client: Vec::new(),
        };
        let mut out = Vec::new();
        r.tls.start(CONN, -1, "test peer", &mut out);
        r.take(out);
        r
    }

    fn take(&mut self, out: Vec<TlsOut>) {
        for o in out {
            match o {
                TlsOut::Recv { buf, len, .. } => {
                    assert!(self.recv.replace((buf, len)).is_none(), "two receives");
                }
                TlsOut::Send { buf, len, .. } => {
                    assert!(self.send.replace((buf, len)).is_none(), "two sends");
                }
                TlsOut::Tls(_, outcome) => self.events.push(format!("{outcome:?}")),
                TlsOut::Received(_, r) => self.events.push(format!("{r:?}")),
                TlsOut::Sent(_, s) => self.events.push(format!("{s:?}")),
            }
        }
    }

    /// Completes the pending send (to the client) and receive (from it).
    fn turn(&mut self) -> bool {
        let mut out = Vec::new();
        let mut moved = false;
        if let Some((buf, len)) = self.send.take() {
            // SAFETY: the session keeps its output until the send completes.
            let mut bytes = unsafe { std::slice::from_raw_parts(buf, len) };
            while !bytes.is_empty() {
                self.client.read_tls(&mut bytes).expect("client read_tls");
                self.client.process_new_packets().expect("client");
                let _ = self.client.reader().read_to_end(&mut self.at_client);
            }
            self.tls.send_done(CONN, len as i32, &mut out);
            moved = true;
        }
        if self.recv.is_some() && self.client.wants_write() {
            let (buf, len) = self.recv.take().expect("a receive");
            // SAFETY: the session keeps its receive space until it completes.
            let mut dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
            let n = self.client.write_tls(&mut dst).expect("client write_tls");
            self.tls.recv_done(CONN, n as i32, &mut out);
            moved = true;
        }
        self.take(out);
        moved
    }

    fn run(&mut self) {
        for _ in 0..100 {
            if !self.turn() {
                return;
            }
        }
        panic!("no quiet");
    }
}

#[test]
fn handshake_then_engine_receives_and_sends_through_the_session() {
    let mut r = Ring::new();
    r.run();
    assert_eq!(r.events, ["Up { cert_name: Some(\"client1\") }"]);
    let mut buf = vec![0u8; 100];
    let mut out = Vec::new();
    assert!(r.tls.recv(CONN, buf.as_mut_ptr(), buf.len(), &mut out));
    r.take(out);
    r.client.writer().write_all(b"hello").expect("write");
    r.run();
    assert_eq!(r.events[1], "Data(5)");
    assert_eq!(&buf[..5], b"hello");
    // A reply with an empty iovec among its pieces, then one past a chunk.
    let pieces = [pattern(16, 1), Vec::new(), pattern(70_000, 2)];
    for (want, pieces) in [
        (70_016, pieces.to_vec()),
        (SEND_CHUNK, vec![pattern(SEND_CHUNK + 4096, 3)]),
    ] {
        let mut iovs: Vec<libc::iovec> = pieces
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: a zeroed msghdr is valid; only its iovecs are read.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iovs.as_mut_ptr();
        msg.msg_iovlen = iovs.len();
        r.at_client.clear();
        let mut out = Vec::new();
        assert!(r.tls.send(CONN, &msg, &mut out));
        r.take(out);
        r.run();
        assert_eq!(
            r.events.last().map(String::as_str),
            Some(&*format!("{:?}", Sent::Bytes(want)))
        );
        assert_eq!(r.at_client, pieces.concat()[..want]);
    }
    // The client leaves: the engine's receive ends.
    let mut out = Vec::new();
    r.tls.recv(CONN, buf.as_mut_ptr(), buf.len(), &mut out);
    r.take(out);
    let mut out = Vec::new();
    r.recv = None;
    r.tls.recv_done(CONN, 0, &mut out);
    r.take(out);
    assert_eq!(
        r.events.last().map(String::as_str),
        Some(&*format!("{:?}", Received::Eof))
    );
    r.tls.close(CONN);
    assert!(r.tls.orphans.is_empty());
}

#[test]
fn a_refused_certificate_is_reported_after_its_alert_has_left() {
    let mut r = Ring::new();
    r.client = client("client-v1-cert.pem");
    // Restart with the v1 client (the first one never spoke).
    r.tls = TlsConns::new(0, Some(server_config()));
    r.recv = None;
    let mut out = Vec::new();
    r.tls.start(CONN, -1, "test peer", &mut out);
    r.take(out);
    for _ in 0..10 {
        if let Some((buf, len)) = r.send.take() {
            // SAFETY: as in `turn`.
            let mut bytes = unsafe { std::slice::from_raw_parts(buf, len) };
            let alert = r.events.is_empty()
                && r.client.read_tls(&mut bytes).is_ok()
                && r.client.process_new_packets().is_err();
            let mut out = Vec::new();
            r.tls.send_done(CONN, len as i32, &mut out);
            r.take(out);
            if alert {
                assert_eq!(r.events, [format!("{:?}", TlsOutcome::Failed)]);
                return;
            }
            continue;
        }
        assert!(
            r.events.is_empty(),
            "failed before its alert left: {:?}",
            r.events
        );
        r.turn();
    }
    panic!("no alert: {:?}", r.events);
}

#[test]
fn no_request_is_received_while_a_reply_waits_in_the_kernel() {
    let mut r = Ring::new();
    r.run();
    let reply = pattern(20_000, 4);
    let mut iov = [libc::iovec {
        iov_base: reply.as_ptr() as *mut libc::c_void,
        iov_len: reply.len(),
    }];
    // SAFETY: a zeroed msghdr is valid; only its iovecs are read.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 1;
    let mut buf = vec![0u8; 100];
    let mut out = Vec::new();
    assert!(r.tls.send(CONN, &msg, &mut out));
    assert!(r.tls.recv(CONN, buf.as_mut_ptr(), buf.len(), &mut out));
    r.take(out);
    assert!(r.send.is_some());
    assert!(r.recv.is_none(), "the receive waits for the send");
    r.client.writer().write_all(b"next").expect("write");
    r.run();
    assert_eq!(r.events[1..], ["Bytes(20000)", "Data(4)"]);
    assert_eq!(&buf[..4], b"next");
    assert_eq!(r.at_client, reply);
}
