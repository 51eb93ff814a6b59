//! A reactor's TLS connections: each one's [`TlsSession`] between the
//! engine's plaintext receives and sends and the socket's ciphertext, all on
//! the reactor's thread and ring. An engine receive is answered from the
//! session's decrypted plaintext, or waits for a ciphertext receive into the
//! session's buffer (decrypted straight into the engine's buffer); an engine
//! send is encrypted into the session's output and reported once that
//! ciphertext has left. This owns no descriptor: the socket is [`super::socks`]'s.
//!
//! Invariant: a ciphertext receive or send is in the kernel only while the
//! engine waits for something on that connection (the TLS handshake, a
//! receive, a send), so the engine closes no connection under it; a session
//! closed anyway (a send of handshake records outlived the handshake) is
//! kept until its operations complete.

use std::sync::Arc;

use rustls::ServerConfig;

use crate::engine::{ConnId, Received, Sent, TlsOutcome};
use crate::tls::session::{Phase, TlsFailure, TlsSession};

/// Most plaintext one engine send encrypts at once; the engine sends the
/// rest after this is reported (a partial send), so the session's output
/// stays bounded.
const SEND_CHUNK: usize = 1 << 20;

/// What the reactor must do for its TLS connections.
#[derive(Debug)]
pub(super) enum TlsOut {
    /// Receive ciphertext: an `Op::TlsRecv` SQE.
    Recv {
        conn: ConnId,
        fd: i32,
        buf: *mut u8,
        len: usize,
    },
    /// Send ciphertext: an `Op::TlsSend` SQE.
    Send {
        conn: ConnId,
        fd: i32,
        buf: *const u8,
        len: usize,
    },
    Tls(ConnId, TlsOutcome),
    Received(ConnId, Received),
    Sent(ConnId, Sent),
}

/// One TLS connection's session and what is in flight around it.
struct TlsConn {
    conn: ConnId,
    fd: i32,
    peer: Box<str>,
    session: TlsSession,
    /// The handshake's outcome was reported to the engine.
    reported: bool,
    /// The engine's receive waiting for plaintext.
    recv: Option<(*mut u8, usize)>,
    /// The engine's send: its plaintext bytes, and the ciphertext total its
    /// last byte brings the output to.
    send: Option<(usize, u64)>,
    /// A ciphertext receive is in the kernel.
    receiving: bool,
    /// A ciphertext send is in the kernel.
    sending: bool,
    /// The socket's input ended: 0 for EOF, else an errno.
    input_end: Option<i32>,
    /// A send failed with this errno: nothing more goes out.
    output_error: Option<i32>,
}

pub(super) struct TlsConns {
    id: usize,
    config: Option<Arc<ServerConfig>>,
    slots: Vec<Option<TlsConn>>,
    /// Sessions closed with an operation still in the kernel.
    orphans: Vec<TlsConn>,
}

impl TlsConns {
    pub(super) fn new(id: usize, config: Option<Arc<ServerConfig>>) -> TlsConns {
        TlsConns {
            id,
            config,
            slots: Vec::new(),
            orphans: Vec::new(),
        }
    }

    fn get(&mut self, conn: ConnId) -> Option<&mut TlsConn> {
        match self.slots.get_mut(conn.index as usize) {
            Some(Some(t)) if t.conn == conn => Some(t),
            _ => None,
        }
    }

    /// Starts TLS on `conn` (socket `fd`): the handshake's first receive.
    pub(super) fn start(&mut self, conn: ConnId, fd: i32, peer: &str, out: &mut Vec<TlsOut>) {
        let session = match self.config.clone().map(TlsSession::new) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::warn!(reactor = self.id, peer, "TLS session: {e}");
                out.push(TlsOut::Tls(conn, TlsOutcome::Failed));
                return;
            }
            None => {
                tracing::warn!(
                    reactor = self.id,
                    peer,
                    "STARTTLS without a [tls] configuration"
                );
                out.push(TlsOut::Tls(conn, TlsOutcome::Failed));
                return;
            }
        };
        let i = conn.index as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let t = TlsConn {
            conn,
            fd,
            peer: peer.into(),
            session,
            reported: false,
            recv: None,
            send: None,
            receiving: false,
            sending: false,
            input_end: None,
            output_error: None,
        };
        if let Some(old) = self.slots[i].replace(t) {
            self.orphan(old);
        }
        self.advance(conn, out);
    }

    /// The engine's receive on a TLS connection; false: not one.
    pub(super) fn recv(
        &mut self,
        conn: ConnId,
        buf: *mut u8,
        len: usize,
        out: &mut Vec<TlsOut>,
    ) -> bool {
        let Some(t) = self.get(conn) else {
            return false;
        };
        debug_assert!(t.recv.is_none(), "{conn:?}: two receives at once");
        t.recv = Some((buf, len));
        self.advance(conn, out);
        true
    }

    /// The engine's send on a TLS connection; false: not one.
    pub(super) fn send(
        &mut self,
        conn: ConnId,
        msg: *const libc::msghdr,
        out: &mut Vec<TlsOut>,
    ) -> bool {
        let id = self.id;
        let Some(t) = self.get(conn) else {
            return false;
        };
        debug_assert!(t.send.is_none(), "{conn:?}: two sends at once");
        // SAFETY: the engine keeps the msghdr and its iovecs in place until
        // the send is reported.
        let iovs = unsafe {
            let m = &*msg;
            std::slice::from_raw_parts(m.msg_iov, m.msg_iovlen)
        };
        // The first SEND_CHUNK bytes, empty iovecs skipped.
        let mut left = SEND_CHUNK;
        let pieces = iovs.iter().filter_map(|v| {
            let n = v.iov_len.min(left);
            left -= n;
            // SAFETY: as above; each iovec is readable for its length.
            (n > 0).then(|| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, n) })
        });
        let plain: usize = iovs
            .iter()
            .map(|v| v.iov_len)
            .sum::<usize>()
            .min(SEND_CHUNK);
        match t.session.write(pieces) {
            Ok(()) => t.send = Some((plain, t.session.queued_total())),
            Err(f) => {
                tracing::info!(reactor = id, peer = &*t.peer, "TLS send failed: {f}");
                out.push(TlsOut::Sent(conn, Sent::Error(libc::EPROTO)));
            }
        }
        self.advance(conn, out);
        true
    }

    /// A ciphertext receive completed with `res` (bytes, 0 at EOF, -errno).
    pub(super) fn recv_done(&mut self, conn: ConnId, res: i32, out: &mut Vec<TlsOut>) {
        let id = self.id;
        let Some(t) = self.get(conn) else {
            self.orphan_done(conn, true);
            return;
        };
        assert!(
            t.receiving,
            "{conn:?}: a TLS receive completed never posted"
        );
        t.receiving = false;
        if res <= 0 {
            t.input_end = Some(-res);
        } else {
            let reported = t.reported;
            let (dst, waiting): (&mut [u8], bool) = match t.recv {
                // SAFETY: the engine keeps its receive buffer until the
                // receive is reported.
                Some((buf, len)) if reported => {
                    (unsafe { std::slice::from_raw_parts_mut(buf, len) }, true)
                }
                _ => (&mut [], false),
            };
            match t.session.received(res as usize, dst) {
                Ok(n) if n > 0 && waiting => {
                    t.recv = None;
                    out.push(TlsOut::Received(conn, Received::Data(n)));
                }
                Ok(_) => {}
                Err(f) => failed(id, t, &f),
            }
        }
        self.advance(conn, out);
    }

    /// A ciphertext send completed with `res` (bytes sent, or -errno).
    pub(super) fn send_done(&mut self, conn: ConnId, res: i32, out: &mut Vec<TlsOut>) {
        let Some(t) = self.get(conn) else {
            self.orphan_done(conn, false);
            return;
        };
        assert!(t.sending, "{conn:?}: a TLS send completed never posted");
        t.sending = false;
        match res {
            r if r > 0 => t.session.sent(r as usize),
            0 => t.output_error = Some(libc::EPIPE),
            r => t.output_error = Some(-r),
        }
        self.advance(conn, out);
    }

    /// The engine shuts the connection down: a session that is up says
    /// close_notify first, if the socket takes it now.
    pub(super) fn shutdown(&mut self, conn: ConnId) {
        let Some(t) = self.get(conn) else { return };
        if t.sending || !t.session.output().is_empty() || t.output_error.is_some() {
            return;
        }
        t.session.close_notify();
        let out = t.session.output();
        // SAFETY: a non-blocking send of our own bytes on our own socket.
        let n = unsafe {
            libc::send(
                t.fd,
                out.as_ptr().cast(),
                out.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            t.session.sent(n as usize);
        }
    }

    /// The connection is closed: its session goes, once nothing of it is
    /// in the kernel.
    pub(super) fn close(&mut self, conn: ConnId) {
        if let Some(t) = self
            .get(conn)
            .is_some()
            .then(|| self.slots[conn.index as usize].take())
            .flatten()
        {
            self.orphan(t);
        }
    }

    fn orphan(&mut self, t: TlsConn) {
        if t.receiving || t.sending {
            self.orphans.push(t);
        }
    }

    fn orphan_done(&mut self, conn: ConnId, recv: bool) {
        let Some(i) = self
            .orphans
            .iter()
            .position(|t| t.conn == conn && if recv { t.receiving } else { t.sending })
        else {
            tracing::error!(reactor = self.id, ?conn, "a TLS completion for no session");
            return;
        };
        let t = &mut self.orphans[i];
        if recv {
            t.receiving = false;
        } else {
            t.sending = false;
        }
        if !t.receiving && !t.sending {
            self.orphans.swap_remove(i);
        }
    }

    /// Reports what the session can answer now, and posts the ciphertext
    /// receive and send it needs.
    fn advance(&mut self, conn: ConnId, out: &mut Vec<TlsOut>) {
        let id = self.id;
        let Some(t) = self.get(conn) else { return };
        if !t.reported {
            report_handshake(id, t, out);
        }
        if t.reported {
            answer_recv(t, out);
        }
        if let Some((plain, end)) = t.send {
            let sent = t.session.queued_total() - t.session.output().len() as u64;
            if let Some(e) = t.output_error {
                t.send = None;
                out.push(TlsOut::Sent(conn, Sent::Error(e)));
            } else if sent >= end {
                t.send = None;
                out.push(TlsOut::Sent(conn, Sent::Bytes(plain)));
            }
        }
        let pending = t.session.output();
        if !t.sending && t.output_error.is_none() && !pending.is_empty() {
            t.sending = true;
            out.push(TlsOut::Send {
                conn,
                fd: t.fd,
                buf: pending.as_ptr(),
                len: pending.len(),
            });
        }
        // No request is received while a reply's ciphertext waits in the
        // kernel for room (the send is posted first, for this): a client
        // that decrypts slower than the reactor encrypts (64 KiB READs, a
        // few MB of replies queued) would otherwise wake the reactor for
        // each request it sends as it reads one reply. Its requests wait
        // in the socket and come in one receive once the send is done, and
        // their replies go in one send. NBD clients read while they write.
        let phase = t.session.phase();
        let wants_input = match phase {
            Phase::Handshaking => true,
            Phase::Up => t.recv.is_some() && !t.session.readable() && !t.sending,
            Phase::PeerClosed | Phase::Failed => false,
        };
        if wants_input && !t.receiving && t.input_end.is_none() {
            let space = t.session.recv_space();
            t.receiving = true;
            out.push(TlsOut::Recv {
                conn,
                fd: t.fd,
                buf: space.as_mut_ptr(),
                len: space.len(),
            });
        }
    }
}

/// The handshake is over (up, or failed with its alert sent): tell the engine.
fn report_handshake(id: usize, t: &mut TlsConn, out: &mut Vec<TlsOut>) {
    let flushed = t.session.output().is_empty() || t.output_error.is_some();
    let outcome = match t.session.phase() {
        Phase::Handshaking if t.input_end.is_some() => {
            tracing::info!(
                reactor = id,
                peer = &*t.peer,
                "TLS handshake failed: the client left"
            );
            TlsOutcome::Failed
        }
        Phase::Handshaking => return,
        Phase::Failed if !flushed => return,
        Phase::Failed => TlsOutcome::Failed,
        Phase::Up | Phase::PeerClosed => {
            let Some(e) = t.session.established() else {
                unreachable!("a session up has established");
            };
            let cert_name = e
                .peer_cert
                .as_ref()
                .and_then(|c| crate::tls::common_name(c));
            tracing::info!(
                reactor = id,
                peer = &*t.peer,
                version = ?e.version,
                cipher = ?e.suite,
                client_cert = cert_name.as_deref().unwrap_or("-"),
                "TLS session up"
            );
            TlsOutcome::Up { cert_name }
        }
    };
    t.reported = true;
    out.push(TlsOut::Tls(t.conn, outcome));
}

/// Answers the engine's waiting receive from plaintext, or with how the
/// input ended.
fn answer_recv(t: &mut TlsConn, out: &mut Vec<TlsOut>) {
    let Some((buf, len)) = t.recv else { return };
    let result = if t.session.readable() {
        // SAFETY: the engine keeps its receive buffer until it is reported.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        Received::Data(t.session.read(dst))
    } else {
        match (t.session.phase(), t.input_end) {
            (Phase::Failed, _) if !t.session.output().is_empty() && t.output_error.is_none() => {
                return; // its alert goes first
            }
            (Phase::Failed, _) => Received::Error(libc::EPROTO),
            (Phase::PeerClosed, _) | (_, Some(0)) => Received::Eof,
            (_, Some(errno)) => Received::Error(errno),
            _ => return,
        }
    };
    t.recv = None;
    out.push(TlsOut::Received(t.conn, result));
}

/// Logs why the session failed; its alert is in the output.
fn failed(id: usize, t: &TlsConn, f: &TlsFailure) {
    let what = if t.reported {
        "TLS session failed"
    } else {
        "TLS handshake failed"
    };
    tracing::info!(
        reactor = id,
        peer = &*t.peer,
        reason = %f,
        alerted = f.alerted,
        alert = ?f.cert_alert(),
        "{what}"
    );
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
