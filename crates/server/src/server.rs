//! `iopace serve`: builds the catalog and pool, starts reactors, listeners and
//! the admin socket, and drains everything on SIGINT/SIGTERM.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pace::pacer::{DeviceOps, DeviceQos, LinkWindow, TenantClock};
use pace::pool::{PoolConfig, SharedPool};

use crate::config::{ConfigError, LoadedConfig};
use crate::engine::Timeouts;
use crate::exports::Catalog;
use crate::reactor::{Msg, Reactor, ReactorHandle, ReactorSettings};
use crate::rpc;
use crate::sockets::SocketFiles;

#[derive(Debug)]
pub enum ServeError {
    /// The configuration is wrong: exit status 2.
    Config(ConfigError),
    /// The environment refused something (bind, io_uring, memory): exit 1.
    Runtime(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "config error: {e}"),
            ServeError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

fn runtime(what: impl std::fmt::Display) -> ServeError {
    ServeError::Runtime(what.to_string())
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn raw_fd(&self) -> i32 {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }

    /// Accepts one connection; returns it with a description of its peer.
    fn accept(&self) -> std::io::Result<(OwnedFd, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                // Replies are batched per loop already; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok((s.into(), peer.to_string()))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept()?;
                let peer = crate::sockets::peer_uid(&s)
                    .map_or_else(|_| "unix".into(), |uid| format!("unix uid {uid}"));
                Ok((s.into(), peer))
            }
        }
    }
}

/// Signals the main thread waits for; blocked in every thread so only sigwait sees them.
fn blocked_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Binds every configured listener; the Unix socket files go into `files`.
fn bind_listeners(
    cfg: &crate::config::ServerConfig,
    files: &mut SocketFiles,
) -> Result<Vec<Listener>, ServeError> {
    let mut listeners = Vec::new();
    for addr in &cfg.tcp {
        let l = TcpListener::bind(addr)
            .map_err(|e| runtime(format!("cannot listen on tcp {addr}: {e}")))?;
        tracing::info!(
            "listening on tcp {}",
            l.local_addr().map_or(addr.clone(), |a| a.to_string())
        );
        listeners.push(Listener::Tcp(l));
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

/// The reactor threads and their handles.
struct Reactors {
    handles: Vec<Arc<ReactorHandle>>,
    threads: Vec<JoinHandle<()>>,
}

impl Reactors {
    /// Asks every reactor to drain and waits for all of them.
    fn stop(self) {
        for h in &self.handles {
            h.send(Msg::Shutdown);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn reactor_count(cfg: &crate::config::ServerConfig) -> usize {
    if cfg.reactors == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.reactors
    }
}

/// Starts the reactors and waits until each has its io_uring; if any fails,
/// the ones already running are stopped.
fn start_reactors(
    loaded: &LoadedConfig,
    catalog: &Arc<Catalog>,
    pool: &Arc<SharedPool>,
) -> Result<Reactors, ServeError> {
    let cfg = &loaded.config;
    let n = reactor_count(&cfg.server);
    let origin = Instant::now();
    let device_ops = catalog
        .pacing
        .device_ops
        .map(|limit| DeviceOps::new(catalog.devices.len(), limit));
    let tenant_clock = TenantClock::with_reactors(catalog.pacing.tenants.len().max(1), n);
    let qos_targets: Vec<_> = catalog.devices.iter().map(|d| d.qos).collect();
    let device_qos = DeviceQos::new(&qos_targets, origin.elapsed().as_nanos() as u64);
    let link_window = LinkWindow::new(n);
    let mut reactors = Reactors {
        handles: Vec::with_capacity(n),
        threads: Vec::with_capacity(n),
    };
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    for id in 0..n {
        let settings = ReactorSettings {
            id,
            device_ops: device_ops.clone(),
            tenant_clock: tenant_clock.clone(),
            device_qos: device_qos.clone(),
            link_window: link_window.clone(),
            max_requests: cfg.server.max_requests_per_reactor,
            drain_timeout: Duration::from_secs(cfg.server.drain_timeout_s),
            timeouts: Timeouts {
                handshake: secs(cfg.server.handshake_timeout_s),
                idle: secs(cfg.server.idle_timeout_s),
                payload: secs(cfg.server.payload_timeout_s),
            },
        };
        let spawned = spawn_reactor(settings, catalog, pool, origin, ready_tx.clone());
        match spawned {
            Ok((handle, thread)) => {
                reactors.handles.push(handle);
                reactors.threads.push(thread);
            }
            Err(e) => {
                reactors.stop();
                return Err(e);
            }
        }
    }
    drop(ready_tx);
    for _ in 0..n {
        let failure = match ready_rx.recv() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => "a reactor thread died during start-up".into(),
        };
        reactors.stop();
        return Err(runtime(failure));
    }
    Ok(reactors)
}

fn spawn_reactor(
    settings: ReactorSettings,
    catalog: &Arc<Catalog>,
    pool: &Arc<SharedPool>,
    origin: Instant,
    ready: mpsc::Sender<Result<(), String>>,
) -> Result<(Arc<ReactorHandle>, JoinHandle<()>), ServeError> {
    let id = settings.id;
    let handle = ReactorHandle::new().map_err(|e| runtime(format!("eventfd: {e}")))?;
    let (catalog, pool, h) = (catalog.clone(), pool.clone(), handle.clone());
    let thread = std::thread::Builder::new()
        .name(format!("iopace-r{id}"))
        .spawn(
            move || match Reactor::new(settings, h, catalog, pool, origin) {
                Err(e) => {
                    let _ = ready.send(Err(format!("reactor {id}: cannot set up io_uring: {e}")));
                }
                Ok(r) => {
                    let _ = ready.send(Ok(()));
                    if let Err(e) = r.run() {
                        tracing::error!(reactor = id, "reactor stopped: {e}");
                    }
                }
            },
        )
        .map_err(|e| runtime(format!("spawn reactor: {e}")))?;
    Ok((handle, thread))
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

    fn warn(&mut self, what: &str, error: &std::io::Error) {
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

/// The reactor with the fewest live connections, ties broken round-robin:
/// clients that open a probe connection before the real one still spread out.
fn pick_reactor(handles: &[Arc<ReactorHandle>], next: &AtomicUsize) -> usize {
    let start = next.fetch_add(1, Ordering::Relaxed);
    let n = handles.len();
    (0..n)
        .map(|k| (start + k) % n)
        .min_by_key(|&r| handles[r].conns.load(Ordering::Relaxed))
        .unwrap_or(0)
}

fn accept_loop(
    listener: &Listener,
    handles: &[Arc<ReactorHandle>],
    next: &AtomicUsize,
    stopping: &AtomicBool,
) {
    let mut warning = RateLimitedWarning::new(Duration::from_secs(10));
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::Relaxed) {
            return;
        }
        match accepted {
            Ok((fd, peer)) => {
                let r = pick_reactor(handles, next);
                tracing::info!(%peer, reactor = r, "accepted a connection");
                handles[r].conns.fetch_add(1, Ordering::Relaxed);
                handles[r].send(Msg::NewConn(fd));
            }
            Err(e) => {
                warning.warn("accept", &e);
                // Out of descriptors (EMFILE): give connections time to close.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn start_acceptors(
    listeners: &Arc<Vec<Listener>>,
    handles: &[Arc<ReactorHandle>],
    stopping: &Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<()>>, ServeError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut acceptors = Vec::new();
    for i in 0..listeners.len() {
        let (mine, handles) = (listeners.clone(), handles.to_vec());
        let (next, stop) = (next.clone(), stopping.clone());
        let spawned = std::thread::Builder::new()
            .name("iopace-accept".into())
            .spawn(move || accept_loop(&mine[i], &handles, &next, &stop));
        match spawned {
            Ok(t) => acceptors.push(t),
            Err(e) => {
                stop_acceptors(listeners, stopping, acceptors);
                return Err(runtime(format!("spawn acceptor: {e}")));
            }
        }
    }
    Ok(acceptors)
}

fn stop_acceptors(listeners: &[Listener], stopping: &AtomicBool, acceptors: Vec<JoinHandle<()>>) {
    stopping.store(true, Ordering::Relaxed);
    for l in listeners {
        // SAFETY: wakes the blocked accept() on our own listening socket.
        unsafe {
            libc::shutdown(l.raw_fd(), libc::SHUT_RDWR);
        }
    }
    for a in acceptors {
        let _ = a.join();
    }
}

/// Waits for SIGINT or SIGTERM; SIGHUP reloads the config meanwhile.
fn wait_for_stop(set: &libc::sigset_t, loaded: &LoadedConfig, rpc_state: &rpc::RpcState) {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: waits for one of the signals blocked in every thread.
        unsafe {
            libc::sigwait(set, &mut sig);
        }
        if sig == libc::SIGHUP {
            crate::reload::reload(loaded, rpc_state);
            continue;
        }
        tracing::info!(signal = sig, "shutting down: draining in-flight IO");
        return;
    }
}

/// The admin socket and the metrics endpoint, when configured.
fn start_services(
    cfg: &crate::config::ServerConfig,
    rpc_state: &Arc<rpc::RpcState>,
    files: &mut SocketFiles,
) -> Result<(), ServeError> {
    if !cfg.rpc.as_os_str().is_empty() {
        rpc::spawn(&cfg.rpc, rpc_state.clone()).map_err(|e| {
            runtime(format!(
                "cannot listen on admin socket {}: {e}",
                cfg.rpc.display()
            ))
        })?;
        // The RPC thread is not joined at exit: a client may hold it.
        files.add(&cfg.rpc);
    }
    if let Some(addr) = &cfg.metrics {
        crate::metrics::spawn(addr, rpc_state.reactors.clone())
            .map_err(|e| runtime(format!("cannot serve metrics on {addr}: {e}")))?;
    }
    Ok(())
}

pub fn serve(loaded: LoadedConfig) -> Result<(), ServeError> {
    let set = blocked_signals();
    // SAFETY: process-wide signal setup before any thread is spawned.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let cfg = &loaded.config;
    let catalog = Arc::new(Catalog::build(&loaded).map_err(ServeError::Config)?);
    let pool = SharedPool::new(PoolConfig {
        num_shared_buffers: cfg.buffers.num_shared_buffers,
        buffer_size: cfg.buffers.buffer_size.0 as u32,
        buf_cache_size: cfg.buffers.buf_cache_size,
    })
    .map_err(|e| runtime(format!("cannot allocate the buffer pool: {e}")))?;
    // Dropped on every return: a failed start leaves no socket file behind.
    let mut files = SocketFiles::default();
    let listeners = Arc::new(bind_listeners(&cfg.server, &mut files)?);
    let reactors = start_reactors(&loaded, &catalog, &pool)?;
    let rpc_state = Arc::new(rpc::RpcState::new(
        reactors.handles.clone(),
        loaded.to_json(),
        catalog.pacing.clone(),
    ));
    if let Err(e) = start_services(&cfg.server, &rpc_state, &mut files) {
        reactors.stop();
        return Err(e);
    }
    let stopping = Arc::new(AtomicBool::new(false));
    let acceptors = match start_acceptors(&listeners, &reactors.handles, &stopping) {
        Ok(a) => a,
        Err(e) => {
            reactors.stop();
            return Err(e);
        }
    };
    tracing::info!(
        reactors = reactors.handles.len(),
        exports = catalog.exports.len(),
        "iopace serving"
    );
    wait_for_stop(&set, &loaded, &rpc_state);
    stop_acceptors(&listeners, &stopping, acceptors);
    reactors.stop();
    if let Err(e) = catalog.bdevs.flush_all_sync() {
        tracing::error!("flushing file bdevs at shutdown: {e}");
    }
    rpc_state.stopping.store(true, Ordering::Relaxed);
    drop(files);
    let free = pool.free_total();
    tracing::info!(
        free_buffers = free,
        total = cfg.buffers.num_shared_buffers,
        "stopped"
    );
    Ok(())
}

fn secs(s: u64) -> pace::Nanos {
    s.saturating_mul(1_000_000_000)
}
