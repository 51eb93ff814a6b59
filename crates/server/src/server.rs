//! `iopace serve`: builds the catalog and pool, starts reactors, listeners and
//! the admin socket, and drains everything on SIGINT/SIGTERM.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pace::pacer::{DeviceOps, DeviceQos, LinkWindow, TenantClock};
use pace::pool::{PoolConfig, SharedPool};

use crate::config::{ConfigError, LoadedConfig};
use crate::exports::Catalog;
use crate::reactor::{Msg, Reactor, ReactorHandle, ReactorSettings};
use crate::rpc;

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
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn raw_fd(&self) -> i32 {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> std::io::Result<OwnedFd> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are batched per loop already; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok(s.into())
            }
            Listener::Unix(l, _) => Ok(l.accept()?.0.into()),
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
        set
    }
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

    let mut listeners = Vec::new();
    for addr in &cfg.server.tcp {
        let l = TcpListener::bind(addr)
            .map_err(|e| runtime(format!("cannot listen on tcp {addr}: {e}")))?;
        tracing::info!(
            "listening on tcp {}",
            l.local_addr().map_or(addr.clone(), |a| a.to_string())
        );
        listeners.push(Listener::Tcp(l));
    }
    for path in &cfg.server.unix {
        rpc::remove_stale_socket(path);
        let l = UnixListener::bind(path).map_err(|e| {
            runtime(format!(
                "cannot listen on unix socket {}: {e}",
                path.display()
            ))
        })?;
        tracing::info!("listening on unix {}", path.display());
        listeners.push(Listener::Unix(l, path.clone()));
    }

    let n = if cfg.server.reactors == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.server.reactors
    };
    let origin = Instant::now();
    let device_ops = catalog
        .pacing
        .device_ops
        .map(|limit| DeviceOps::new(catalog.devices.len(), limit));
    let tenant_clock = TenantClock::with_reactors(catalog.pacing.tenants.len().max(1), n);
    let qos_targets: Vec<_> = catalog.devices.iter().map(|d| d.qos).collect();
    let device_qos = DeviceQos::new(&qos_targets, origin.elapsed().as_nanos() as u64);
    let link_window = LinkWindow::new(n);
    let mut handles = Vec::with_capacity(n);
    let mut threads: Vec<JoinHandle<()>> = Vec::with_capacity(n);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    for id in 0..n {
        let handle = ReactorHandle::new().map_err(|e| runtime(format!("eventfd: {e}")))?;
        handles.push(handle.clone());
        let catalog = catalog.clone();
        let pool = pool.clone();
        let ready = ready_tx.clone();
        let settings = ReactorSettings {
            id,
            device_ops: device_ops.clone(),
            tenant_clock: tenant_clock.clone(),
            device_qos: device_qos.clone(),
            link_window: link_window.clone(),
            max_requests: cfg.server.max_requests_per_reactor,
            drain_timeout: Duration::from_secs(cfg.server.drain_timeout_s),
        };
        let t = std::thread::Builder::new()
            .name(format!("iopace-r{id}"))
            .spawn(
                move || match Reactor::new(settings, handle, catalog, pool, origin) {
                    Err(e) => {
                        let _ =
                            ready.send(Err(format!("reactor {id}: cannot set up io_uring: {e}")));
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
        threads.push(t);
    }
    drop(ready_tx);
    for _ in 0..n {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(runtime(e)),
            Err(_) => return Err(runtime("a reactor thread died during start-up")),
        }
    }
    tracing::info!(
        reactors = n,
        exports = catalog.exports.len(),
        "iopace serving"
    );

    let rpc_state = Arc::new(rpc::RpcState {
        reactors: handles.clone(),
        config: loaded.to_json(),
        stopping: AtomicBool::new(false),
    });
    let rpc_path = cfg.server.rpc.clone();
    let rpc_thread = if rpc_path.as_os_str().is_empty() {
        None
    } else {
        Some(rpc::spawn(&rpc_path, rpc_state.clone()).map_err(|e| {
            runtime(format!(
                "cannot listen on admin socket {}: {e}",
                rpc_path.display()
            ))
        })?)
    };

    let listeners: Arc<Vec<Listener>> = Arc::new(listeners);
    let next = Arc::new(AtomicUsize::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    let mut acceptors = Vec::new();
    for i in 0..listeners.len() {
        let listeners = listeners.clone();
        let handles = handles.clone();
        let next = next.clone();
        let stopping = stopping.clone();
        acceptors.push(
            std::thread::Builder::new()
                .name("iopace-accept".into())
                .spawn(move || loop {
                    match listeners[i].accept() {
                        Ok(fd) => {
                            if stopping.load(Ordering::Relaxed) {
                                return;
                            }
                            // The reactor with the fewest live connections, ties
                            // broken round-robin: clients that open a probe
                            // connection before the real one still spread out.
                            let start = next.fetch_add(1, Ordering::Relaxed);
                            let n = handles.len();
                            let r = (0..n)
                                .map(|k| (start + k) % n)
                                .min_by_key(|&r| handles[r].conns.load(Ordering::Relaxed))
                                .unwrap_or(0);
                            handles[r].conns.fetch_add(1, Ordering::Relaxed);
                            handles[r].send(Msg::NewConn(fd));
                        }
                        Err(e) => {
                            if stopping.load(Ordering::Relaxed) {
                                return;
                            }
                            tracing::warn!("accept: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                })
                .map_err(|e| runtime(format!("spawn acceptor: {e}")))?,
        );
    }

    let mut sig: libc::c_int = 0;
    // SAFETY: waits for one of the signals blocked above.
    unsafe {
        libc::sigwait(&set, &mut sig);
    }
    tracing::info!(signal = sig, "shutting down: draining in-flight IO");
    stopping.store(true, Ordering::Relaxed);
    for l in listeners.iter() {
        // SAFETY: wakes the blocked accept() on our own listening socket.
        unsafe {
            libc::shutdown(l.raw_fd(), libc::SHUT_RDWR);
        }
    }
    for a in acceptors {
        let _ = a.join();
    }
    for h in &handles {
        h.send(Msg::Shutdown);
    }
    for t in threads {
        let _ = t.join();
    }
    if let Err(e) = catalog.bdevs.flush_all_sync() {
        tracing::error!("flushing file bdevs at shutdown: {e}");
    }
    rpc_state.stopping.store(true, Ordering::Relaxed);
    if rpc_thread.is_some() {
        // The RPC thread is not joined: a client may hold it; exit ends it.
        let _ = std::fs::remove_file(&rpc_path);
    }
    for l in listeners.iter() {
        if let Listener::Unix(_, path) = l {
            let _ = std::fs::remove_file(path);
        }
    }
    let free = pool.free_total();
    tracing::info!(
        free_buffers = free,
        total = cfg.buffers.num_shared_buffers,
        "stopped"
    );
    Ok(())
}
