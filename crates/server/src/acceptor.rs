//! Listeners and their accept threads: each accepted connection goes to the
//! least-loaded reactor straight away; a TLS listener's with a handshake
//! that offers STARTTLS, which the reactor serves (see [`crate::tls`]).

use std::net::{IpAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{runtime, ServeError};
use crate::exports::Catalog;
use crate::reactor::{Accepted, Msg, ReactorHandle};
use crate::sockets::SocketFiles;
use config::access::Client;
use config::tls::TlsMode;
use config::{ServerConfig, WirePorts};

/// A bound listener; a TCP one with the target port it is on, where its
/// capacity is known (`config::WirePorts`).
pub enum Listener {
    Tcp(TcpListener, TlsMode, Option<usize>),
    Unix(UnixListener),
    /// NVMe/TCP (`[server] nvme_tcp`).
    Nvme(TcpListener, Option<usize>),
}

impl Listener {
    fn raw_fd(&self) -> i32 {
        match self {
            Listener::Tcp(l, ..) | Listener::Nvme(l, _) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }

    fn tls(&self) -> TlsMode {
        match self {
            Listener::Tcp(_, mode, _) => *mode,
            Listener::Unix(_) | Listener::Nvme(..) => TlsMode::Off,
        }
    }

    /// The target port its connections come in on, if the pacers know it.
    fn port(&self) -> Option<usize> {
        match self {
            Listener::Tcp(_, _, port) | Listener::Nvme(_, port) => *port,
            Listener::Unix(_) => None,
        }
    }

    /// Accepts one connection; returns it with a description of its peer
    /// and the peer's address (none on a Unix socket).
    fn accept(&self) -> std::io::Result<(OwnedFd, String, Option<IpAddr>)> {
        match self {
            Listener::Tcp(l, ..) | Listener::Nvme(l, _) => {
                let (s, peer) = l.accept()?;
                // Replies are batched per loop already; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok((s.into(), peer.to_string(), Some(peer.ip())))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept()?;
                let peer = crate::sockets::peer_uid(&s)
                    .map_or_else(|_| "unix".into(), |uid| format!("unix uid {uid}"));
                Ok((s.into(), peer, None))
            }
        }
    }
}

/// Binds every configured NBD listener, each TCP one on its port in
/// `ports`; the Unix socket files go into `files`.
pub fn bind_listeners(
    cfg: &ServerConfig,
    ports: &WirePorts,
    files: &mut SocketFiles,
) -> Result<Vec<Listener>, ServeError> {
    assert_eq!(cfg.tcp.len(), ports.tcp.len(), "one port each");
    let mut listeners = Vec::new();
    for (listener, &port) in cfg.tcp.iter().zip(&ports.tcp) {
        let addr = listener.addr();
        let l = TcpListener::bind(addr)
            .map_err(|e| runtime(format!("cannot listen on tcp {addr}: {e}")))?;
        let tls = listener.tls(cfg.tls);
        tracing::info!(
            ?tls,
            port,
            "listening on tcp {}",
            l.local_addr().map_or(addr.to_string(), |a| a.to_string())
        );
        listeners.push(Listener::Tcp(l, tls, port));
    }
    for path in &cfg.unix {
        let l = crate::sockets::bind(path).map_err(|e| {
            runtime(format!(
                "cannot listen on unix socket {}: {e}",
                path.display()
            ))
        })?;
        files.add(path);
        tracing::info!("listening on unix {}", path.display());
        listeners.push(Listener::Unix(l));
    }
    Ok(listeners)
}

/// A warning repeated at most once per interval, with a count of the ones held back.
struct RateLimitedWarning {
    interval: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl RateLimitedWarning {
    fn new(interval: Duration) -> Self {
        RateLimitedWarning {
            interval,
            last: None,
            held_back: 0,
        }
    }

    fn warn(&mut self, what: &str, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.interval)
        {
            self.held_back += 1;
            return;
        }
        tracing::warn!(repeated = self.held_back, "{what}: {error}");
        self.last = Some(now);
        self.held_back = 0;
    }
}

/// What every accept thread shares.
pub struct Acceptors {
    pub listeners: Arc<Vec<Listener>>,
    pub handles: Vec<Arc<ReactorHandle>>,
    pub catalog: Arc<Catalog>,
    next: AtomicUsize,
    stopping: AtomicBool,
}

impl Acceptors {
    pub fn new(
        listeners: Vec<Listener>,
        handles: Vec<Arc<ReactorHandle>>,
        catalog: Arc<Catalog>,
    ) -> Arc<Acceptors> {
        Arc::new(Acceptors {
            listeners: Arc::new(listeners),
            handles,
            catalog,
            next: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
        })
    }

    /// The reactor with the fewest live connections, ties broken round-robin:
    /// clients that open a probe connection before the real one still spread out.
    fn pick_reactor(&self) -> &Arc<ReactorHandle> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.handles.len();
        let r = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&r| self.handles[r].conns.load(Ordering::Relaxed))
            .unwrap_or(0);
        &self.handles[r]
    }

    fn accept_loop(&self, listener: &Listener) {
        let mut warning = RateLimitedWarning::new(Duration::from_secs(10));
        loop {
            let accepted = listener.accept();
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            match accepted {
                Ok((fd, peer, _)) if matches!(listener, Listener::Nvme(..)) => {
                    // Its host is known at Connect, and checked there.
                    tracing::info!(%peer, "nvme/tcp: accepted a connection");
                    let reactor = self.pick_reactor();
                    reactor.conns.fetch_add(1, Ordering::Relaxed);
                    let port = listener.port();
                    reactor.send(Msg::NewNvme(Accepted { fd, peer, port }));
                }
                Ok((fd, peer, addr)) => {
                    let accepted = Accepted {
                        fd,
                        peer,
                        port: listener.port(),
                    };
                    self.dispatch(accepted, addr, listener.tls());
                }
                Err(e) => {
                    warning.warn("accept", &e);
                    // Out of descriptors (EMFILE): give connections time to close.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    fn dispatch(&self, accepted: Accepted, addr: Option<IpAddr>, tls: TlsMode) {
        let reactor = self.pick_reactor();
        let peer = &accepted.peer;
        tracing::info!(%peer, ?tls, port = accepted.port, "accepted a connection");
        let c = &self.catalog;
        reactor.conns.fetch_add(1, Ordering::Relaxed);
        if tls == TlsMode::Off && c.access.is_open() {
            reactor.send(Msg::NewConn(accepted));
            return;
        }
        let mut hs = c.handshake().with_tls(tls.handshake_tls());
        if !c.access.is_open() {
            let client = Client {
                addr,
                cert_name: None,
                hostnqn: None,
            };
            hs.set_access(c.access.for_client(&client, peer));
            hs.set_tls_opens(c.access.tls_opens());
        }
        reactor.send(Msg::Resume(accepted, Box::new(hs)));
    }
}

pub fn start(acceptors: &Arc<Acceptors>) -> Result<Vec<JoinHandle<()>>, ServeError> {
    let mut threads = Vec::new();
    for i in 0..acceptors.listeners.len() {
        let mine = acceptors.clone();
        let spawned = std::thread::Builder::new()
            .name("iopace-accept".into())
            .spawn(move || mine.accept_loop(&mine.listeners[i]));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop(acceptors, threads);
                return Err(runtime(format!("spawn acceptor: {e}")));
            }
        }
    }
    Ok(threads)
}

pub fn stop(acceptors: &Acceptors, threads: Vec<JoinHandle<()>>) {
    acceptors.stopping.store(true, Ordering::Relaxed);
    for l in acceptors.listeners.iter() {
        // SAFETY: wakes the blocked accept() on our own listening socket.
        unsafe {
            libc::shutdown(l.raw_fd(), libc::SHUT_RDWR);
        }
    }
    for t in threads {
        let _ = t.join();
    }
}
