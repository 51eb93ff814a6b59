//! NVMe over TCP front end. Each export is an NVM subsystem (its `nqn`, or
//! `nqn.2026-11.io.iopace:NAME`) whose bdev is namespace 1; the discovery
//! controller lists them. One thread serves every NVMe/TCP connection: the
//! protocol is the sans-IO `proto::nvme` (queue and controller state
//! machines), driven by `driver.rs`, with data commands admitted by a pacer
//! built from the same pacing config and cost models as the reactors'.

mod conn;
mod device;
mod driver;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use pace::pacer::{PacerGroup, PacingConfig};
use proto::nvme::ctrl::{Limits, Listener, Namespace, Subsystem, Target};

use crate::config::LoadedConfig;
use crate::exports::Catalog;

/// A pacing change for the NVMe/TCP thread, taken at its next turn.
pub type PacingMailbox = Arc<Mutex<Option<PacingConfig>>>;

/// The running NVMe/TCP thread.
pub struct NvmfServer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    pacing: PacingMailbox,
}

impl NvmfServer {
    /// Where a pacing change (SIGHUP, `set_pacing`) is left for the thread.
    pub fn pacing(&self) -> PacingMailbox {
        self.pacing.clone()
    }

    /// Stops accepting and serving, closes every connection, and waits.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Binds every `[server] nvme_tcp` address; Err says which failed and why.
pub fn bind(addrs: &[String]) -> Result<Vec<TcpListener>, String> {
    let mut out = Vec::with_capacity(addrs.len());
    for a in addrs {
        let l = TcpListener::bind(a.as_str())
            .map_err(|e| format!("cannot listen on nvme-tcp {a}: {e}"))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("nvme-tcp {a}: {e}"))?;
        tracing::info!("listening on nvme-tcp {a}");
        out.push(l);
    }
    Ok(out)
}

/// The subsystems: one per export, its bdev as namespace 1.
pub fn subsystems(loaded: &LoadedConfig, catalog: &Catalog) -> Vec<Subsystem> {
    let cfg = &loaded.config;
    catalog
        .exports
        .iter()
        .zip(&cfg.exports)
        .enumerate()
        .map(|(i, (e, ec))| {
            let nqn = ec.subsystem_nqn();
            let shift = e.bdev.block_size().max(512).ilog2().clamp(9, 12) as u8;
            let mut ns = Namespace::new(1, e.bdev.size(), shift, &nqn);
            ns.read_only = e.info.read_only;
            Subsystem {
                nqn,
                serial: format!("IOPACE{i:014}"),
                model: format!("iopace {}", e.info.name),
                namespaces: vec![ns],
                hosts: None,
            }
        })
        .collect()
}

/// What the discovery log lists: the listeners' addresses.
fn listeners(ls: &[TcpListener]) -> Vec<Listener> {
    ls.iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a: SocketAddr| Listener {
            traddr: a.ip().to_string(),
            trsvcid: a.port().to_string(),
            ipv6: a.is_ipv6(),
        })
        .collect()
}

/// Starts the NVMe/TCP thread on `listeners` (none: nothing starts); Err
/// says what the environment refused.
pub fn start(
    listeners_: Vec<TcpListener>,
    loaded: &LoadedConfig,
    catalog: &Arc<Catalog>,
    buffer_size: u32,
) -> Result<Option<NvmfServer>, String> {
    if listeners_.is_empty() {
        return Ok(None);
    }
    let s = &loaded.config.server;
    let limits = Limits {
        max_transfer: loaded.max_request_bytes().clamp(4096, 1 << 20),
        ..Limits::default()
    };
    let target = Target::new(subsystems(loaded, catalog), listeners(&listeners_), limits);
    let origin = Instant::now();
    let devices = catalog.paced_devices();
    let group = PacerGroup::new(&catalog.pacing, &devices, 1, buffer_size, 0);
    let pacer = group.pacer(0, 0);
    let timeouts = driver::Timeouts {
        handshake: s.handshake_timeout_s.saturating_mul(1_000_000_000),
        stalled_pdu: s.payload_timeout_s.saturating_mul(1_000_000_000),
        poll: s.poll,
        spin: s.poll_spin_us.saturating_mul(1000),
    };
    let pacing: PacingMailbox = Arc::new(Mutex::new(None));
    let parts = driver::Parts {
        target,
        pacer,
        pacing: pacing.clone(),
        catalog: catalog.clone(),
        origin,
        timeouts,
    };
    let d = driver::Driver::new(listeners_, parts)
        .map_err(|e| format!("nvme-tcp: cannot set up io_uring: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("iopace-nvmf".into())
        .spawn(move || d.run(&flag))
        .map_err(|e| format!("spawn nvme-tcp thread: {e}"))?;
    Ok(Some(NvmfServer {
        stop,
        thread,
        pacing,
    }))
}

/// Resolves an `ADDR:PORT` (for messages and tests).
pub fn resolve(addr: &str) -> Option<SocketAddr> {
    addr.to_socket_addrs().ok()?.next()
}
