//! TLS (NBD_OPT_STARTTLS) for TCP listeners with `tls = "on"` or `"require"`.
//!
//! The reactors only ever see plaintext: a connection from a TLS listener is
//! negotiated on its own thread with the same sans-IO [`Handshake`] until
//! STARTTLS (or, when TLS is optional and the client never asks, until the
//! export is chosen). After the TLS handshake that thread becomes a relay
//! between the TLS socket and one end of a socketpair; the reactor gets the
//! other end with the handshake to resume. This costs one copy through the
//! socketpair in each direction on top of rustls's own; kTLS would avoid it
//! where the kernel has it (CONFIG_TLS), which this machine does not.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use config::tls::{ClientCerts, TlsConfig};
use config::{ConfigError, LoadedConfig};
use proto::{Handshake, HandshakeStatus};
use rustls::server::WebPkiClientVerifier;
use rustls::{ServerConfig, ServerConnection};

/// Counts the TLS connections alive, against `[tls] max_sessions`.
#[derive(Debug)]
pub struct SessionLimit {
    max: usize,
    live: AtomicUsize,
}

/// One TLS connection's place under the limit; dropping it frees the place.
#[derive(Debug)]
pub struct SessionSlot(Arc<SessionLimit>);

impl SessionLimit {
    pub fn new(max: usize) -> Arc<SessionLimit> {
        Arc::new(SessionLimit {
            max,
            live: AtomicUsize::new(0),
        })
    }

    /// A place for one more session, or None when `max` are alive.
    pub fn try_enter(self: &Arc<Self>) -> Option<SessionSlot> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionSlot(self.clone()))
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let was = self.0.live.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(was > 0, "TLS session slot freed twice");
    }
}

fn read_pem(path: &str) -> Result<Vec<u8>, (&'static str, String)> {
    std::fs::read(Path::new(path)).map_err(|e| ("", format!("{path}: {e}")))
}

/// The rustls configuration of `[tls]`, with its files read and checked.
pub fn config_of(loaded: &LoadedConfig) -> Result<Option<Arc<ServerConfig>>, ConfigError> {
    let Some(t) = &loaded.config.tls else {
        return Ok(None);
    };
    server_config(t)
        .map(Some)
        .map_err(|(field, m)| loaded.error_at("tls", 0, field, m))
}

/// Builds the rustls server configuration; an error names the `[tls]` field.
pub fn server_config(c: &TlsConfig) -> Result<Arc<ServerConfig>, (&'static str, String)> {
    let mut provider = rustls::crypto::ring::default_provider();
    // AES-128-GCM first, and our order over the client's: it is as safe as
    // AES-256 for TLS and a quarter cheaper for both ends, which share this
    // machine's cores in loopback setups (issue 13's TLS cost goal).
    provider.cipher_suites.sort_by_key(|s| {
        let name = format!("{:?}", s.suite());
        (!name.contains("AES_128_GCM"), !name.contains("AES_256_GCM"))
    });
    let provider = Arc::new(provider);
    let pem = read_pem(&c.cert).map_err(|(_, m)| ("cert", m))?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| ("cert", format!("{}: {e}", c.cert)))?;
    if certs.is_empty() {
        return Err(("cert", format!("{}: no PEM certificate in it", c.cert)));
    }
    let pem = read_pem(&c.key).map_err(|(_, m)| ("key", m))?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| ("key", format!("{}: {e}", c.key)))?
        .ok_or_else(|| ("key", format!("{}: no PEM private key in it", c.key)))?;
    let mode = c.client_certs.unwrap_or(if c.ca.is_some() {
        ClientCerts::Require
    } else {
        ClientCerts::None
    });
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ("cert", e.to_string()))?;
    let builder = match (mode, &c.ca) {
        (ClientCerts::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err(("ca", "client certificates need a ca".into())),
        (_, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            let pem = read_pem(ca).map_err(|(_, m)| ("ca", m))?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(|e| ("ca", format!("{ca}: {e}")))?;
                roots.add(cert).map_err(|e| ("ca", format!("{ca}: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match mode {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| ("ca", e.to_string()))?)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ("key", format!("{}: {e}", c.key)))?;
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// Where a TLS listener's connection goes once negotiated far enough: a
/// reactor, with the handshake to resume.
pub type HandOff = Box<dyn FnOnce(OwnedFd, Handshake) + Send>;

/// Longest a client may take over the handshake before TLS is up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// One TLS listener's connection: who it is and what it may reach.
pub struct Session {
    pub peer: String,
    pub client: config::access::Client,
    pub catalog: Arc<crate::exports::Catalog>,
    pub config: Arc<ServerConfig>,
}

/// The common name of a client certificate, for `cn:NAME` access rules.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Serves one connection of a TLS listener on the calling thread.
pub fn serve_connection(
    tcp: TcpStream,
    mut session: Session,
    mut hs: Handshake,
    hand_off: HandOff,
) {
    let peer = session.peer.as_str();
    match negotiate(&tcp, &mut hs) {
        Ok(HandshakeStatus::Done(_)) => {
            // TLS was optional and the client went on without it.
            tracing::info!(peer, "plaintext on a TLS listener: no STARTTLS");
            if tcp.set_read_timeout(None).is_ok() {
                hand_off(tcp.into(), hs);
            }
        }
        Ok(HandshakeStatus::StartTls) => match start_tls(&tcp, session.config.clone()) {
            Ok(tls) => {
                session.client.cert_name = tls
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| common_name(c));
                log_session(peer, &tls, session.client.cert_name.as_deref());
                let access = &session.catalog.access;
                if !access.is_open() {
                    hs.set_access(access.for_client(&session.client, peer));
                }
                hs.tls_started();
                match relay_pair() {
                    Ok((mine, reactors)) => {
                        hand_off(reactors.into(), hs);
                        if let Err(e) = relay(tls, &tcp, &mine) {
                            tracing::debug!(peer, "TLS relay ended: {e}");
                        }
                    }
                    Err(e) => tracing::warn!(peer, "socketpair for TLS relay: {e}"),
                }
            }
            Err(e) => tracing::info!(peer, "TLS handshake failed: {e}"),
        },
        Ok(_) => tracing::debug!(peer, "handshake closed before TLS"),
        Err(e) => tracing::debug!(peer, "handshake before TLS: {e}"),
    }
}

/// Drives the handshake over blocking IO, reading exactly one client message
/// at a time so no byte past it is taken, until it is no longer negotiating.
fn negotiate(mut tcp: &TcpStream, hs: &mut Handshake) -> io::Result<HandshakeStatus> {
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.write_all(&hs.take_output())?;
    let mut buf = Vec::new();
    while *hs.status() == HandshakeStatus::Negotiating {
        let want = hs.wanted(&buf);
        if buf.len() < want {
            let start = buf.len();
            buf.resize(want, 0);
            tcp.read_exact(&mut buf[start..])?;
        }
        let used = hs.feed(&buf);
        buf.drain(..used);
        tcp.write_all(&hs.take_output())?;
    }
    Ok(hs.status().clone())
}

fn start_tls(tcp: &TcpStream, config: Arc<ServerConfig>) -> io::Result<ServerConnection> {
    let mut tls = ServerConnection::new(config).map_err(io::Error::other)?;
    let mut stream = tcp;
    while tls.is_handshaking() {
        tls.complete_io(&mut stream)?;
    }
    Ok(tls)
}

fn log_session(peer: &str, tls: &ServerConnection, cert_name: Option<&str>) {
    tracing::info!(
        peer,
        version = ?tls.protocol_version(),
        cipher = ?tls.negotiated_cipher_suite().map(|c| c.suite()),
        client_cert = cert_name.unwrap_or("-"),
        "TLS session up"
    );
}

/// Decrypted bytes held for the reactor before the relay stops reading TLS,
/// and plaintext taken from the reactor in one wake-up.
const RELAY_LIMIT: usize = 1 << 20;

/// Send buffer of each end of the relay's socketpair. A Unix stream socket
/// holds what its peer has not read against the sender's buffer: at the
/// default (~208 KiB) a reactor's batch of 128 KiB replies goes through in
/// pieces, each a wake-up of the relay and a partial send to resubmit.
const RELAY_SOCKET_BUFFER: libc::c_int = 4 << 20;

/// The socketpair between the relay and the reactor, with large buffers
/// (capped by the kernel at net.core.wmem_max).
fn relay_pair() -> io::Result<(UnixStream, UnixStream)> {
    let (a, b) = UnixStream::pair()?;
    for s in [&a, &b] {
        let size = RELAY_SOCKET_BUFFER;
        // SAFETY: setting an int socket option on a socket we own, with its size.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!("TLS relay SO_SNDBUF: {}", io::Error::last_os_error());
        }
    }
    Ok((a, b))
}

/// Moves plaintext between the TLS session and the reactor's socket until
/// either side closes.
fn relay(mut tls: ServerConnection, tcp: &TcpStream, plain: &UnixStream) -> io::Result<()> {
    tcp.set_read_timeout(None)?;
    tcp.set_write_timeout(None)?;
    tcp.set_nonblocking(true)?;
    plain.set_nonblocking(true)?;
    let mut to_reactor: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    // The relay bounds what it reads from the reactor (only while no TLS
    // records wait to be sent), so rustls need not: its limit would cut writes.
    tls.set_buffer_limit(None);
    let mut tcp_done = take_plaintext(&mut tls, &mut to_reactor, &mut buf)?;
    let mut reactor_done = false;
    loop {
        flush_tls(&mut tls, tcp)?;
        flush_plain(&mut to_reactor, plain)?;
        if tcp_done && to_reactor.is_empty() {
            // The client is gone and the reactor has every byte: let it see EOF.
            let _ = plain.shutdown(std::net::Shutdown::Write);
        }
        if reactor_done && !tls.wants_write() {
            return Ok(());
        }
        if tcp_done && reactor_done {
            return Ok(());
        }
        let read_tcp = !tcp_done && to_reactor.len() < RELAY_LIMIT;
        let read_plain = !reactor_done && !tls.wants_write();
        let mut fds = [
            poll_fd(tcp.as_raw_fd(), read_tcp, tls.wants_write()),
            poll_fd(plain.as_raw_fd(), read_plain, !to_reactor.is_empty()),
        ];
        // SAFETY: polling two descriptors we own, with a correctly sized array.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if read_tcp && fds[0].revents != 0 {
            tcp_done = from_client(&mut tls, tcp, &mut to_reactor, &mut buf)?;
        }
        if read_plain && fds[1].revents != 0 {
            reactor_done = from_reactor(&mut tls, plain, &mut buf)?;
        }
    }
}

fn poll_fd(fd: i32, read: bool, write: bool) -> libc::pollfd {
    let mut events = 0;
    if read {
        events |= libc::POLLIN;
    }
    if write {
        events |= libc::POLLOUT;
    }
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
}

fn flush_tls(tls: &mut ServerConnection, mut tcp: &TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut tcp) {
            Ok(_) => {}
            Err(e) if would_block(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn flush_plain(pending: &mut Vec<u8>, mut plain: &UnixStream) -> io::Result<()> {
    while !pending.is_empty() {
        match plain.write(pending) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if would_block(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads TLS records from the client and queues their plaintext; returns
/// whether the client has finished.
fn from_client(
    tls: &mut ServerConnection,
    mut tcp: &TcpStream,
    to_reactor: &mut Vec<u8>,
    buf: &mut [u8],
) -> io::Result<bool> {
    match tls.read_tls(&mut tcp) {
        Ok(0) => return Ok(true),
        Ok(_) => {}
        Err(e) if would_block(&e) => return Ok(false),
        Err(e) => return Err(e),
    }
    take_plaintext(tls, to_reactor, buf)
}

/// Queues the plaintext the session holds; returns whether the client has
/// closed. The last handshake flight can carry the first options, so this
/// runs once before the relay waits on the socket.
fn take_plaintext(
    tls: &mut ServerConnection,
    to_reactor: &mut Vec<u8>,
    buf: &mut [u8],
) -> io::Result<bool> {
    let state = tls.process_new_packets().map_err(io::Error::other)?;
    loop {
        match tls.reader().read(buf) {
            Ok(0) => return Ok(true),
            Ok(n) => to_reactor.extend_from_slice(&buf[..n]),
            Err(e) if would_block(&e) => return Ok(state.peer_has_closed()),
            Err(e) => return Err(e),
        }
    }
}

/// Reads plaintext replies from the reactor into the TLS session until the
/// socket is empty or `RELAY_LIMIT` is encrypted and waiting (one wake-up
/// takes a whole batch of replies); returns whether the reactor has closed
/// the connection.
fn from_reactor(
    tls: &mut ServerConnection,
    mut plain: &UnixStream,
    buf: &mut [u8],
) -> io::Result<bool> {
    let mut taken = 0;
    while taken < RELAY_LIMIT {
        match plain.read(buf) {
            Ok(0) => {
                tls.send_close_notify();
                return Ok(true);
            }
            Ok(n) => {
                tls.writer().write_all(&buf[..n])?;
                taken += n;
            }
            Err(e) if would_block(&e) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_limit_refuses_beyond_max_and_frees_on_drop() {
        let limit = SessionLimit::new(2);
        let a = limit.try_enter().expect("first");
        let b = limit.try_enter().expect("second");
        assert!(limit.try_enter().is_none(), "a third beyond max 2");
        drop(a);
        let c = limit.try_enter().expect("a place was freed");
        drop((b, c));
        assert_eq!(limit.live.load(Ordering::Acquire), 0);
    }
}
