//! The simulated target: the server's request engines, one per reactor,
//! over the real shared buffer pool, serving one null export per (device,
//! tenant). The simulator replaces only the IO around them: sockets, links
//! and devices.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bdev::{BdevKind, BdevSpec, ByteSize, DelaySpec, Geometry};
use config::LoadedConfig;
use config::{BufferConfig, Config, ExportConfig, ServerConfig};
use pace::pacer::{DeviceQos, PacedDevice, Pacer, PacerGroup, PortLoad, QosConfig};
use pool::SharedPool;
use server::engine::{Engine, EngineSettings, Timeouts, PAYLOAD_CAP};
use server::exports::Catalog;

use crate::devices::Dev;
use crate::scenario::{DeviceKind, RunConfig, Scenario};

/// Size of every export: past the farthest offset a host draws (2^32 4 KiB blocks).
const EXPORT_SIZE: u64 = 1 << 46;

/// What the fault fuzzer sets that a performance run leaves at the
/// server's defaults: short timeouts that its faults reach (and no more
/// request slots than the hosts' IOs need).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeouts: Timeouts,
    /// A delay layer in each device's bdev, this many microseconds on
    /// average (0: none): completions the engine holds on its own timers.
    pub engine_delay_us: u64,
    pub drain_timeout: pace::Nanos,
}

pub struct Target {
    pub engines: Vec<Engine>,
    pub pool: Arc<SharedPool>,
    catalog: Arc<Catalog>,
    /// Set by the pool's waker when a reactor has grants or must drain its
    /// cache: the simulator ticks that reactor's engine at once, as a woken
    /// reactor's next loop does.
    woken: Arc<[AtomicBool]>,
    /// Tenants the exports are split by (at least one).
    tenants: usize,
    pub qos: Arc<DeviceQos>,
    /// The ports' capacities, which the pacers know (a port's step
    /// changes it).
    pub ports: Arc<PortLoad>,
    /// Each export's NVMe subsystem NQN, in catalog order.
    nqns: Vec<String>,
}

impl Target {
    /// The target of `run`: its reactors, pool and exports; `slots` request
    /// slots per reactor.
    pub fn new(
        sc: &Scenario,
        run: &RunConfig,
        devs: &[Dev],
        slots: u32,
        limits: Option<Limits>,
    ) -> Target {
        let reactors = run.reactors.unwrap_or(sc.target.reactors);
        let tenants = run.pacing.tenants.len().max(1);
        let delay_us = limits.map_or(0, |l| l.engine_delay_us);
        let catalog = Arc::new(catalog(sc, run, devs.len(), tenants, delay_us));
        let nqns = nqns(devs.len(), tenants);
        let pool = SharedPool::new(catalog_buffers(sc, run).pool())
            // Scenario validation checks the buffer size and count.
            .unwrap_or_else(|e| panic!("scenario {}: buffer pool: {e}", sc.name));
        let woken: Arc<[AtomicBool]> = (0..reactors).map(|_| AtomicBool::new(false)).collect();
        let qos_targets: Vec<_> = devs
            .iter()
            .map(|d| match d.kind {
                DeviceKind::Nvme => run.qos.or(d.qos),
                DeviceKind::Delay => d.qos,
            })
            .collect();
        let (pacers, qos, ports) = pacers(sc, run, &catalog, devs, &qos_targets);
        let server = ServerConfig::default();
        let secs = |s: u64| s * 1_000_000_000;
        let max_requests = match limits {
            Some(_) => slots.max(1),
            None => slots.max(server.max_requests_per_reactor),
        };
        let limits = limits.unwrap_or(Limits {
            timeouts: Timeouts {
                handshake: secs(server.handshake_timeout_s),
                idle: secs(server.idle_timeout_s),
                payload: secs(server.payload_timeout_s),
            },
            drain_timeout: secs(server.drain_timeout_s),
            engine_delay_us: 0,
        });
        let engines = pacers
            .into_iter()
            .enumerate()
            .map(|(id, pacer)| {
                let flags = woken.clone();
                let bufs = pool.register_reactor(Box::new(move || {
                    flags[id].store(true, Ordering::Relaxed);
                }));
                let settings = EngineSettings {
                    id,
                    max_requests,
                    drain_timeout: limits.drain_timeout,
                    timeouts: limits.timeouts,
                    payload_cap: PAYLOAD_CAP,
                };
                Engine::new(settings, catalog.clone(), bufs, pacer, 0)
            })
            .collect();
        Target {
            engines,
            pool,
            catalog,
            woken,
            tenants,
            qos,
            ports,
            nqns,
        }
    }

    /// The NVMe subsystem NQN of `export_name(device, tenant)` (as
    /// [`Target::export`] picks the tenant).
    pub fn nqn(&self, device: usize, tenant: usize) -> &str {
        &self.nqns[device * self.tenants + tenant.min(self.tenants - 1)]
    }

    /// The export serving `device` to `tenant` (one past the run's last is
    /// its last, as in the pacer).
    pub fn export(&self, device: usize, tenant: usize) -> String {
        export_name(device, tenant.min(self.tenants - 1))
    }

    /// The pacer's device queue (the simulated drive) of `export`.
    pub fn device(&self, export: u16) -> usize {
        self.catalog.exports[export as usize].device
    }

    /// Whether the pool woke `reactor` since the last call.
    pub fn take_woken(&self, reactor: usize) -> bool {
        self.woken[reactor].swap(false, Ordering::Relaxed)
    }

    /// Bytes of the buffers held by requests, over every reactor.
    pub fn buffer_bytes_in_use(&self) -> u64 {
        self.engines.iter().map(|e| e.buffer_bytes_in_use()).sum()
    }
}

fn export_name(device: usize, tenant: usize) -> String {
    format!("d{device}.t{tenant}")
}

/// The exports' configs, in catalog order: one per (device, tenant).
fn export_configs(devices: usize, tenants: usize) -> Vec<ExportConfig> {
    (0..devices)
        .flat_map(|d| (0..tenants).map(move |t| (d, t)))
        .map(|(d, t)| ExportConfig {
            name: export_name(d, t),
            bdev: format!("d{d}"),
            read_only: false,
            description: String::new(),
            allow: None,
            read_only_for: Vec::new(),
            nqn: None,
            dirty_bitmaps: Vec::new(),
            dirty_granularity: None,
            dirty_bitmap_file: None,
        })
        .collect()
}

fn nqns(devices: usize, tenants: usize) -> Vec<String> {
    let exports = export_configs(devices, tenants);
    exports.iter().map(|e| e.subsystem_nqn()).collect()
}

/// The pool's settings: the target's, as a run overrides them, and the
/// server's defaults for the rest.
fn catalog_buffers(sc: &Scenario, run: &RunConfig) -> BufferConfig {
    let defaults = BufferConfig::default();
    BufferConfig {
        num_shared_buffers: run
            .num_shared_buffers
            .unwrap_or(sc.target.num_shared_buffers),
        buffer_size: ByteSize(u64::from(sc.target.buffer_size)),
        buf_cache_size: run.buf_cache_size.unwrap_or(sc.target.buf_cache_size),
        num_small_buffers: sc
            .target
            .num_small_buffers
            .unwrap_or(defaults.num_small_buffers),
        small_buffer_size: sc
            .target
            .small_buffer_size
            .map_or(defaults.small_buffer_size, |s| ByteSize(u64::from(s))),
        ..defaults
    }
}

/// The server's catalog for the run: a null bdev per device, an export per
/// (device, tenant), each tenant listing its exports.
fn catalog(
    sc: &Scenario,
    run: &RunConfig,
    devices: usize,
    tenants: usize,
    delay_us: u64,
) -> Catalog {
    let bdevs = (0..devices).flat_map(|d| bdevs(d, delay_us)).collect();
    let exports = export_configs(devices, tenants);
    let mut pacing = run.pacing.clone();
    for (t, tenant) in pacing.tenants.iter_mut().enumerate() {
        tenant.exports = (0..devices).map(|d| export_name(d, t)).collect();
    }
    let config = Config {
        server: ServerConfig::default(),
        buffers: catalog_buffers(sc, run),
        bdev_tables: Vec::new(),
        exports,
        pacing,
        cost: BTreeMap::new(),
        qos: BTreeMap::new(),
        cost_db: None,
        tls: None,
    };
    let loaded = LoadedConfig {
        config,
        source_name: sc.name.clone(),
        text: String::new(),
        path: None,
        bdevs,
    };
    // Null bdevs of a fixed size and generated names cannot fail to build.
    let mut catalog =
        Catalog::build(&loaded).unwrap_or_else(|e| panic!("scenario {}: catalog: {e}", sc.name));
    // NVMe/TCP hosts: each export is a subsystem, as the server serves it.
    if sc.speaks_nvme(run) {
        let b = &loaded.config.buffers;
        let pool_bytes = u64::from(b.num_shared_buffers) * b.buffer_size.0;
        catalog.nvme = Some(server::nvmf::target(&[], &loaded, &catalog, pool_bytes));
    }
    catalog
}

/// Device `d`'s bdev `d{d}`: null, or a delay layer over a null one.
fn bdevs(d: usize, delay_us: u64) -> Vec<BdevSpec> {
    let null = |name: String| BdevSpec {
        name,
        kind: BdevKind::Null {
            geometry: Geometry::sized(EXPORT_SIZE),
            pattern: None,
        },
    };
    if delay_us == 0 {
        return vec![null(format!("d{d}"))];
    }
    let delay = BdevSpec {
        name: format!("d{d}"),
        kind: BdevKind::Delay {
            base: format!("n{d}"),
            delay: DelaySpec {
                read_avg_us: Some(delay_us),
                read_p99_us: Some(4 * delay_us),
                write_avg_us: Some(delay_us),
                write_p99_us: Some(4 * delay_us),
            },
        },
    };
    vec![null(format!("n{d}")), delay]
}

/// One pacer per reactor, sharing the tenant clock, latency targets, link
/// window and device op limit as the target's reactors do, with each
/// device's cost model from the scenario; and the latency targets' state.
fn pacers(
    sc: &Scenario,
    run: &RunConfig,
    catalog: &Catalog,
    devs: &[Dev],
    qos_targets: &[Option<QosConfig>],
) -> (Vec<Pacer>, Arc<DeviceQos>, Arc<PortLoad>) {
    let reactors = run.reactors.unwrap_or(sc.target.reactors);
    let devices: Vec<PacedDevice> = devs
        .iter()
        .zip(qos_targets)
        .map(|(d, &qos)| PacedDevice {
            cost: d.told_cost,
            qos,
        })
        .collect();
    let mut group = PacerGroup::new(
        &catalog.pacing,
        &devices,
        reactors,
        sc.target.buffer_size,
        0,
    );
    let rates: Vec<f64> = sc.ports.iter().map(|p| p.rate_gbps).collect();
    let ports = group.measure_ports(&rates);
    let pacers = (0..reactors).map(|r| group.pacer(r, 0)).collect();
    (pacers, group.qos().clone(), ports)
}
