//! Exports: what each NBD export name serves, resolved from the config's bdev stack.

use std::sync::Arc;

use bdev::dirty::{DirtyBitmap, DirtyBitmaps};
use bdev::{Bdev, BdevSet};
use pace::pacer::{CostModel, PacedDevice, PacingConfig, QosConfig, TenantConfig};
use proto::{ExportInfo, Handshake, MetaContext, SelectedContext};

use config::{ConfigError, LoadedConfig};

/// One export as the reactors see it: the protocol view and the device behind it.
pub struct Export {
    pub info: ExportInfo,
    pub bdev: Arc<Bdev>,
    /// The pacer's device queue for this export's bdev.
    pub device: usize,
    /// The pacer's tenant for this export.
    pub tenant: usize,
    /// Its dirty bitmaps, marked by every reactor's writes.
    pub dirty: Arc<DirtyBitmaps>,
    /// The granularity of bitmaps added without one.
    pub granularity: u64,
    /// Its `dirty_bitmap_file`, if its bitmaps persist.
    pub persisted: Option<crate::dirty_persist::Persisted>,
}

/// Where one selected metadata context's extents come from.
pub enum MetaSource {
    Allocation,
    Bitmap(Arc<DirtyBitmap>),
}

impl Export {
    /// The sources of the contexts a client selected, with their ids. A
    /// bitmap removed since the handshake stands in retired (all dirty).
    pub fn meta_sources(&self, contexts: &[SelectedContext]) -> Vec<(u32, MetaSource)> {
        let source = |c: &MetaContext| match c {
            MetaContext::Allocation => MetaSource::Allocation,
            MetaContext::DirtyBitmap(name) => MetaSource::Bitmap(
                self.dirty
                    .get(name)
                    .unwrap_or_else(|| Arc::new(DirtyBitmap::retired(name, self.info.size))),
            ),
        };
        contexts
            .iter()
            .map(|c| (c.id, source(&c.context)))
            .collect()
    }
}

impl MetaSource {
    /// Extents `(length, flags)` of `offset..offset + len` (or less).
    pub fn extents(&self, dev: &Bdev, offset: u64, len: u32) -> Vec<(u32, u32)> {
        match self {
            MetaSource::Allocation => dev.block_status(offset, len),
            MetaSource::Bitmap(b) => b.extents(offset, len),
        }
    }
}

/// One pacer device queue: an exported bdev.
pub struct Device {
    pub name: String,
    pub cost: CostModel,
    /// Latency targets, if the config gives this bdev any.
    pub qos: Option<QosConfig>,
}

/// Everything the reactors serve, shared read-only between them.
pub struct Catalog {
    pub exports: Vec<Export>,
    pub infos: Arc<[ExportInfo]>,
    pub bdevs: BdevSet,
    /// Export a client gets when it asks for the empty name.
    pub default_export: Option<usize>,
    pub devices: Vec<Device>,
    /// The pacing config, with a `default` tenant added for exports no tenant names.
    pub pacing: PacingConfig,
    /// Who may open which export, in export order.
    pub access: config::access::Policy,
    /// The NVMe/TCP controllers, when NVMe/TCP is served.
    pub nvme: Option<Arc<NvmeTarget>>,
    /// Each export's dirty bitmaps (as `Export::dirty`), for handshakes.
    dirty: Arc<[Arc<DirtyBitmaps>]>,
    /// The rustls configuration of `[tls]`, for connections that STARTTLS.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// What every engine's NVMe/TCP connections share: the controllers, and
/// the mail between engines. An Abort on an admin queue names an IO
/// command that another reactor's engine holds, and that engine's answer
/// (or a namespace change's event) completes a command on the admin
/// queue's: a change posted to the target bumps `mail` and wakes every
/// reactor, whose engine then takes what is its own (`engine/nvme.rs`).
pub struct NvmeTarget {
    pub target: std::sync::Mutex<proto::nvme::ctrl::Target>,
    mail: std::sync::atomic::AtomicU64,
    wakers: std::sync::Mutex<Vec<Waker>>,
}

/// Wakes one reactor (its eventfd).
pub type Waker = Box<dyn Fn() + Send + Sync>;

impl NvmeTarget {
    pub fn new(target: proto::nvme::ctrl::Target) -> NvmeTarget {
        NvmeTarget {
            target: std::sync::Mutex::new(target),
            mail: std::sync::atomic::AtomicU64::new(0),
            wakers: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A reactor asks to be woken when mail is posted.
    pub fn register_waker(&self, w: Waker) {
        if let Ok(mut ws) = self.wakers.lock() {
            ws.push(w);
        }
    }

    /// How much mail was ever posted: an engine that saw less looks.
    pub fn mail(&self) -> u64 {
        self.mail.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Runs `f` on the target; if it posted mail (`Target::posted`), every
    /// reactor is told once the lock is let go. None: the lock is poisoned.
    pub fn with<R>(&self, f: impl FnOnce(&mut proto::nvme::ctrl::Target) -> R) -> Option<R> {
        let (r, posted) = {
            let mut t = self.target.lock().ok()?;
            let before = t.posted();
            let r = f(&mut t);
            (r, t.posted() != before)
        };
        if posted {
            self.mail.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            if let Ok(ws) = self.wakers.lock() {
                ws.iter().for_each(|w| w());
            }
        }
        Some(r)
    }
}

impl Catalog {
    /// An NBD handshake over these exports, offering their dirty bitmaps
    /// as they are when the client asks.
    pub fn handshake(&self) -> Handshake {
        let dirty = self.dirty.clone();
        let names = move |i: usize| dirty.get(i).map_or_else(Vec::new, |d| d.names());
        Handshake::new(self.infos.clone(), self.default_export).with_bitmaps(Arc::new(names))
    }

    /// The exports whose dirty bitmaps persist in a file.
    pub(crate) fn persisted(
        &self,
    ) -> impl Iterator<Item = crate::dirty_persist::PersistedExport<'_>> {
        let each = self.exports.iter().enumerate();
        each.filter_map(|(i, e)| Some((i, e.info.name.as_str(), &*e.dirty, e.persisted.as_ref()?)))
    }

    /// Each device as the pacers see it: its cost model and latency targets.
    pub fn paced_devices(&self) -> Vec<PacedDevice> {
        self.devices
            .iter()
            .map(|d| PacedDevice {
                cost: d.cost,
                qos: d.qos,
            })
            .collect()
    }

    pub fn build(cfg: &LoadedConfig) -> Result<Catalog, ConfigError> {
        Self::build_with(cfg, bdev::build)
    }

    /// Checks everything [`Catalog::build`] checks, creating no file and
    /// mapping no memory (for `serve --check`).
    pub fn check(cfg: &LoadedConfig) -> Result<Catalog, ConfigError> {
        Self::build_with(cfg, bdev::check)
    }

    fn build_with(
        cfg: &LoadedConfig,
        build_bdevs: fn(&[bdev::BdevSpec]) -> Result<BdevSet, bdev::BuildError>,
    ) -> Result<Catalog, ConfigError> {
        let c = &cfg.config;
        let bdevs = build_bdevs(&cfg.bdevs)
            .map_err(|e| cfg.error_at("bdev", e.index, e.field, e.message.clone()))?;
        let max_block = cfg.max_request_bytes();
        let mut pacing = c.pacing.clone();
        let mut devices: Vec<Device> = Vec::new();
        check_model_names(cfg, &bdevs)?;
        warn_thin_images(cfg, &bdevs);
        let mut exports = Vec::with_capacity(c.exports.len());
        for (i, e) in c.exports.iter().enumerate() {
            let Some(dev) = bdevs.get(&e.bdev) else {
                let known = bdevs.names().join(", ");
                return Err(cfg.error_at(
                    "export",
                    i,
                    "bdev",
                    format!("no bdev named `{}` (bdevs: {known})", e.bdev),
                ));
            };
            check_writable(cfg, i, e, &dev)?;
            let dirty = Arc::new(DirtyBitmaps::new(dev.size()));
            let persisted = crate::dirty_persist::restore(cfg, i, e, &dirty)?;
            exports.push(Export {
                info: export_info(e, &dev, max_block),
                device: device_index(cfg, &mut devices, &e.bdev, &dev),
                tenant: tenant_index(&mut pacing, &e.name),
                bdev: dev,
                dirty,
                granularity: e.granularity(),
                persisted,
            });
        }
        let default_export = exports
            .iter()
            .position(|e| e.info.name == "default")
            .or(if exports.len() == 1 { Some(0) } else { None });
        let infos: Arc<[ExportInfo]> = exports.iter().map(|e| e.info.clone()).collect();
        let dirty = exports.iter().map(|e| e.dirty.clone()).collect();
        let mut access = config::access::Policy::default();
        for (i, e) in c.exports.iter().enumerate() {
            let rules = e
                .rules()
                .map_err(|(field, m)| cfg.error_at("export", i, field, m))?;
            access.exports.push((e.name.clone(), rules));
        }
        Ok(Catalog {
            exports,
            infos,
            bdevs,
            default_export,
            devices,
            pacing,
            access,
            nvme: None,
            dirty,
            tls: None,
        })
    }
}

/// A bdev that can only be read (a file bdev whose image refuses writing)
/// is served by read-only exports alone: as qemu-nbd without -r, a
/// writable export of it is refused, not served read-only behind the back
/// of a config that asked for writes.
fn check_writable(
    cfg: &LoadedConfig,
    i: usize,
    e: &config::ExportConfig,
    dev: &Bdev,
) -> Result<(), ConfigError> {
    if !dev.caps().read_only || e.read_only {
        return Ok(());
    }
    let msg = format!(
        "bdev `{}` can only be read (its image refuses writing: no write permission, \
         immutable, on a read-only filesystem, or a read-only block device): set \
         read_only = true",
        e.bdev
    );
    Err(cfg.error_at("export", i, "read_only", msg))
}

/// A file image larger than its filesystem can hold is served thin, as
/// qemu-nbd and nbdkit serve sparse images; said once at start (and by
/// `serve --check`), since its writes fail with ENOSPC once the filesystem
/// fills, not when it is served.
fn warn_thin_images(cfg: &LoadedConfig, bdevs: &BdevSet) {
    for (i, s) in cfg.bdevs.iter().enumerate() {
        let (bdev::BdevKind::File { path, .. }, Some(dev)) = (&s.kind, bdevs.get(&s.name)) else {
            continue;
        };
        if let Some((unwritten, free)) = bdev::thin_shortfall(path, dev.size()) {
            let msg = format!(
                "{path} is {} bytes, {unwritten} of them not yet allocated, but its \
                 filesystem has {free} bytes free: served thin (sparse); writes past \
                 the free space will fail with ENOSPC",
                dev.size()
            );
            tracing::warn!("{}", cfg.error_at("bdev", i, "size", msg));
        }
    }
}

/// Every `[cost.X]` and `[qos.X]` names a bdev.
fn check_model_names(cfg: &LoadedConfig, bdevs: &BdevSet) -> Result<(), ConfigError> {
    let c = &cfg.config;
    let named = c.cost.keys().map(|n| ("cost", n));
    for (table, name) in named.chain(c.qos.keys().map(|n| ("qos", n))) {
        if bdevs.get(name).is_none() {
            return Err(ConfigError {
                file: cfg.source_name.clone(),
                line: config::locate(&cfg.text, &format!("{table}.{name}"), 0, ""),
                field: Some(format!("{table}.{name}")),
                message: format!("no bdev named `{name}`"),
            });
        }
    }
    Ok(())
}

/// What the handshake tells clients about an export of `dev`.
fn export_info(e: &config::ExportConfig, dev: &Bdev, max_block: u32) -> ExportInfo {
    let caps = dev.caps();
    let writable = !e.read_only;
    ExportInfo {
        name: e.name.clone(),
        description: e.description.clone(),
        size: dev.size(),
        read_only: e.read_only,
        can_flush: writable && caps.flush,
        can_fua: writable && caps.fua,
        can_trim: writable && caps.trim,
        can_write_zeroes: writable && caps.write_zeroes,
        can_fast_zero: writable && caps.fast_zero,
        // Every bdev is coherent across connections: one memory image or
        // one file whose fdatasync covers all writes.
        can_multi_conn: true,
        can_cache: true,
        rotational: caps.rotational,
        min_block: 1,
        pref_block: preferred_block(dev.block_size(), max_block),
        max_block,
    }
}

/// The preferred block size: the device's block, at least a page, and a
/// power of two no larger than the maximum block size. Past the maximum,
/// libnbd (nbdinfo, nbdcopy, fio's nbd engine) drops every constraint of
/// the reply as inconsistent, the maximum included, and may then send
/// requests the server refuses with EOVERFLOW.
fn preferred_block(block_size: u32, max_block: u32) -> u32 {
    debug_assert!(max_block >= 4096, "max_request_size is at least 4 KiB");
    let cap = 1u32 << max_block.max(1).ilog2();
    let pref = block_size.max(4096).min(cap);
    debug_assert!(pref.is_power_of_two() && pref <= max_block);
    pref
}

/// The pacer's device queue for bdev `name`: one per bdev, shared by its
/// exports, with its cost model (config, then the results database, then
/// the kind's default) and latency targets.
fn device_index(cfg: &LoadedConfig, devices: &mut Vec<Device>, name: &str, dev: &Bdev) -> usize {
    if let Some(d) = devices.iter().position(|d| d.name == name) {
        return d;
    }
    let c = &cfg.config;
    let from_db = || {
        let db = c.cost_db.as_deref()?;
        config::cost_db::cost_for(db, &cfg.bdevs, name, dev)
    };
    let cost = c
        .cost
        .get(name)
        .copied()
        .or_else(from_db)
        .unwrap_or(match dev.kind() {
            "file" => CostModel::nvme(),
            _ => CostModel::memory(),
        });
    devices.push(Device {
        name: name.to_string(),
        cost,
        qos: c.qos.get(name).copied(),
    });
    devices.len() - 1
}

/// The tenant of export `name`: the one listing it, else `default`
/// (added when tenants are configured but none is called that).
fn tenant_index(pacing: &mut PacingConfig, name: &str) -> usize {
    if let Some(t) = pacing
        .tenants
        .iter()
        .position(|t| t.exports.iter().any(|x| x == name))
    {
        return t;
    }
    if pacing.tenants.is_empty() {
        return 0;
    }
    if let Some(t) = pacing.tenants.iter().position(|t| t.name == "default") {
        return t;
    }
    pacing.tenants.push(TenantConfig::new("default", 1.0));
    pacing.tenants.len() - 1
}

#[cfg(test)]
mod tests {
    use super::preferred_block;

    #[test]
    fn preferred_block_is_a_power_of_two_within_the_maximum() {
        assert_eq!(preferred_block(512, 64 << 20), 4096);
        assert_eq!(preferred_block(65536, 64 << 20), 65536);
        assert_eq!(preferred_block(65536, 4096), 4096);
        assert_eq!(preferred_block(65536, 12 << 10), 8192);
        assert_eq!(preferred_block(4096, u32::MAX - 4095), 4096);
    }
}
