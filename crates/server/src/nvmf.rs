//! NVMe over TCP: the subsystems and their listeners. Each export is an NVM
//! subsystem (its `nqn`, or `nqn.2026-11.io.iopace:NAME`) whose bdev is
//! namespace 1; the discovery controller lists them. Connections are
//! accepted like NBD's and served by the reactors: the engine's NVMe/TCP
//! front end (`engine/nvme.rs`) runs each one's sans-IO queue
//! (`proto::nvme`) in front of the same request life as NBD's.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

use proto::nvme::ctrl::{Limits, Listener, Namespace, Subsystem, Target};

use crate::exports::{Catalog, NvmeTarget};
use config::LoadedConfig;

/// Binds every `[server] nvme_tcp` address; Err says which failed and why.
pub fn bind(listeners: &[config::TcpListenerConfig]) -> Result<Vec<TcpListener>, String> {
    let mut out = Vec::with_capacity(listeners.len());
    for a in listeners.iter().map(config::TcpListenerConfig::addr) {
        let l = TcpListener::bind(a).map_err(|e| format!("cannot listen on nvme-tcp {a}: {e}"))?;
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
            ns.dealloc_zeroes = e.bdev.trim_reads_zero();
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

/// The controllers every reactor's NVMe/TCP connections share, for the
/// subsystems of `catalog` behind `listeners`. The transfer limit (MDTS) is
/// at most 1 MiB and what a quarter of the pool holds: a command's buffers
/// are taken whole.
pub fn target(
    listeners_: &[TcpListener],
    loaded: &LoadedConfig,
    catalog: &Catalog,
    pool_bytes: u64,
) -> Arc<NvmeTarget> {
    let limits = Limits {
        max_transfer: max_transfer(loaded.max_request_bytes(), pool_bytes),
        ..Limits::default()
    };
    let target = Target::new(subsystems(loaded, catalog), listeners(listeners_), limits);
    Arc::new(NvmeTarget::new(target))
}

/// The transfer limit (MDTS) for requests of at most `max_request` bytes
/// over a pool of `pool_bytes`: a power of two of 4 KiB pages, at most
/// 1 MiB and what a quarter of the pool holds.
pub fn max_transfer(max_request: u32, pool_bytes: u64) -> u32 {
    let fit = u32::try_from(pool_bytes / 4).unwrap_or(u32::MAX);
    let max = max_request.min(fit).clamp(4096, 1 << 20);
    1 << max.ilog2()
}

/// Resolves an `ADDR:PORT` (for messages and tests).
pub fn resolve(addr: &str) -> Option<SocketAddr> {
    addr.to_socket_addrs().ok()?.next()
}
