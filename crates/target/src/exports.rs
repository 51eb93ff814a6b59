//! Exports: what each NBD export name serves, resolved from the config's bdev stack.

use std::sync::Arc;

use bdev::{Bdev, BdevSet};
use proto::ExportInfo;

use crate::config::{ConfigError, LoadedConfig};

/// One export as the reactors see it: the protocol view and the device behind it.
pub struct Export {
    pub info: ExportInfo,
    pub bdev: Arc<Bdev>,
}

/// Everything the reactors serve, shared read-only between them.
pub struct Catalog {
    pub exports: Vec<Export>,
    pub infos: Arc<[ExportInfo]>,
    pub bdevs: BdevSet,
    /// Export a client gets when it asks for the empty name.
    pub default_export: Option<usize>,
}

impl Catalog {
    pub fn build(cfg: &LoadedConfig) -> Result<Catalog, ConfigError> {
        let c = &cfg.config;
        let bdevs = bdev::build(&c.bdevs)
            .map_err(|e| cfg.error_at("bdev", e.index, e.field, e.message.clone()))?;
        let max_block = cfg.max_request_bytes();
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
            let caps = dev.caps();
            let writable = !e.read_only;
            let info = ExportInfo {
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
                pref_block: dev.block_size().max(4096),
                max_block,
            };
            exports.push(Export { info, bdev: dev });
        }
        let default_export = exports
            .iter()
            .position(|e| e.info.name == "default")
            .or(if exports.len() == 1 { Some(0) } else { None });
        let infos: Arc<[ExportInfo]> = exports.iter().map(|e| e.info.clone()).collect();
        Ok(Catalog {
            exports,
            infos,
            bdevs,
            default_export,
        })
    }
}
