//! `iopace serve`: builds the catalog and pool, starts reactors, listeners and
//! the admin socket, and drains everything on SIGINT/SIGTERM.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::LoadedConfig;
use pace::pacer::{PacerGroup, PortLoad};
use pool::SharedPool;

use crate::acceptor::{self, Acceptors};
use crate::engine::Timeouts;
use crate::error::{runtime, ServeError};
use crate::exports::Catalog;
use crate::reactor::{Msg, Reactor, ReactorHandle, ReactorSettings, SendBuffers};
use crate::rpc;
use crate::sockets::SocketFiles;

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

/// The reactor threads and their handles.
struct Reactors {
    handles: Vec<Arc<ReactorHandle>>,
    threads: Vec<JoinHandle<()>>,
    /// Their clock's origin: engine time is nanoseconds since.
    origin: Instant,
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

fn reactor_count(cfg: &config::ServerConfig) -> usize {
    if cfg.reactors == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.reactors
    }
}

/// Starts the reactors and waits until each has its io_uring; if any fails,
/// the ones already running are stopped. Their pacers measure the ports of
/// these capacities (the listeners' `gbps`), if any.
fn start_reactors(
    loaded: &LoadedConfig,
    catalog: &Arc<Catalog>,
    pool: &Arc<SharedPool>,
    port_gbps: &[f64],
) -> Result<(Reactors, Option<Arc<PortLoad>>), ServeError> {
    let cfg = &loaded.config;
    let n = reactor_count(&cfg.server);
    let origin = Instant::now();
    let devices = catalog.paced_devices();
    let mut group = PacerGroup::new(
        &catalog.pacing,
        &devices,
        n,
        pool.buffer_size(),
        origin.elapsed().as_nanos() as u64,
    );
    // No port known: the pacers stay as they were without ports.
    let port_load = (!port_gbps.is_empty()).then(|| group.measure_ports(port_gbps));
    let pacers = Arc::new(group);
    let mut reactors = Reactors {
        handles: Vec::with_capacity(n),
        threads: Vec::with_capacity(n),
        origin,
    };
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    for id in 0..n {
        let settings = reactor_settings(&cfg.server, id, pacers.clone());
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
    Ok((reactors, port_load))
}

/// Reactor `id`'s settings from `[server]`.
fn reactor_settings(
    server: &config::ServerConfig,
    id: usize,
    pacers: Arc<PacerGroup>,
) -> ReactorSettings {
    ReactorSettings {
        id,
        pacers,
        max_requests: server.max_requests_per_reactor,
        drain_timeout: Duration::from_secs(server.drain_timeout_s),
        timeouts: Timeouts {
            handshake: secs(server.handshake_timeout_s),
            idle: secs(server.idle_timeout_s),
            payload: secs(server.payload_timeout_s),
        },
        poll: server.poll,
        poll_spin: Duration::from_micros(server.poll_spin_us),
        batch_wait: Duration::from_micros(server.batch_wait_us),
        splice: server.splice,
        send_buffers: SendBuffers {
            unix: server.unix_send_buffer.0 as usize,
            tcp: server.tcp_send_buffer.0 as usize,
            tcp_notsent_lowat: server.tcp_notsent_lowat.0 as usize,
        },
        ring_entries: 0,
    }
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
    cfg: &config::ServerConfig,
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

/// Binds the NBD and NVMe/TCP listeners, each TCP one on its port, and
/// gives the catalog its NVMe/TCP target if there are any of the latter.
fn bind_all(
    loaded: &LoadedConfig,
    ports: &config::WirePorts,
    catalog: &mut Catalog,
    pool: &SharedPool,
    files: &mut SocketFiles,
) -> Result<Vec<acceptor::Listener>, ServeError> {
    let server = &loaded.config.server;
    let mut listeners = acceptor::bind_listeners(server, ports, files)?;
    let nvme_listeners = crate::nvmf::bind(&server.nvme_tcp).map_err(runtime)?;
    if !nvme_listeners.is_empty() {
        let pool_bytes = u64::from(pool.large_buffers()) * u64::from(pool.buffer_size());
        let target = crate::nvmf::target(&nvme_listeners, loaded, catalog, pool_bytes);
        catalog.nvme = Some(target);
    }
    assert_eq!(nvme_listeners.len(), ports.nvme_tcp.len(), "one port each");
    let nvme = nvme_listeners
        .into_iter()
        .zip(ports.nvme_tcp.iter().copied());
    listeners.extend(nvme.map(|(l, port)| acceptor::Listener::Nvme(l, port)));
    Ok(listeners)
}

pub fn serve(loaded: LoadedConfig) -> Result<(), ServeError> {
    let set = blocked_signals();
    // SAFETY: process-wide signal setup before any thread is spawned.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let cfg = &loaded.config;
    let mut catalog = Catalog::build(&loaded).map_err(ServeError::Config)?;
    let pool = SharedPool::new(cfg.buffers.pool())
        .map_err(|e| runtime(format!("cannot allocate the buffer pool: {e}")))?;
    // Dropped on every return: a failed start leaves no socket file behind.
    let mut files = SocketFiles::default();
    catalog.tls = crate::tls::config_of(&loaded).map_err(ServeError::Config)?;
    let ports = config::WirePorts::of(&cfg.server);
    let listeners = bind_all(&loaded, &ports, &mut catalog, &pool, &mut files)?;
    let catalog = Arc::new(catalog);
    let (reactors, port_load) = start_reactors(&loaded, &catalog, &pool, &ports.gbps)?;
    let mut rpc_state = rpc::RpcState::new(
        reactors.handles.clone(),
        loaded.to_json(),
        catalog.pacing.clone(),
        crate::fault_ctl::FaultControl::new(catalog.bdevs.faults(), reactors.origin),
        crate::dirty_ctl::DirtyControl::new(catalog.clone()),
    );
    rpc_state.ports = port_load.map(|load| rpc::Ports {
        load,
        names: ports.names.clone(),
    });
    let rpc_state = Arc::new(rpc_state);
    // Before the first write can arrive (and before the admin socket
    // answers, so a client that sees it sees the files in use): a crash
    // from here on must leave the bitmap files untrusted.
    if let Err(e) = crate::dirty_persist::mark_in_use(&loaded, catalog.persisted()) {
        reactors.stop();
        return Err(ServeError::Config(e));
    }
    if let Err(e) = start_services(&cfg.server, &rpc_state, &mut files) {
        reactors.stop();
        return Err(e);
    }
    let acceptors = Acceptors::new(listeners, reactors.handles.clone(), catalog.clone());
    let accept_threads = match acceptor::start(&acceptors) {
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
    acceptor::stop(&acceptors, accept_threads);
    reactors.stop();
    if let Err(e) = catalog.bdevs.flush_all_sync() {
        tracing::error!("flushing file bdevs at shutdown: {e}");
    }
    // No reactor runs: no bit can be marked after this save.
    crate::dirty_persist::save_clean(catalog.persisted());
    rpc_state.stopping.store(true, Ordering::Relaxed);
    drop(files);
    let free = pool.free_total();
    tracing::info!(free_buffers = free, total = pool.total(), "stopped");
    Ok(())
}

fn secs(s: u64) -> pace::Nanos {
    s.saturating_mul(1_000_000_000)
}
