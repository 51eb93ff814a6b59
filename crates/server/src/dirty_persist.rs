//! Persistent dirty bitmaps, the server's side of `bdev::dirty_file`: an
//! export's `dirty_bitmap_file` is read when the catalog is built, rewritten
//! marked in use before the first connection is accepted, and rewritten
//! clean, with every bit, after the reactors' last write at a clean
//! shutdown. A server that dies between the two leaves it in use, and the
//! next start treats every bitmap as all dirty.

use std::path::PathBuf;

use bdev::dirty::DirtyBitmaps;
use bdev::dirty_file::{self, FileState};
use config::{ConfigError, ExportConfig, LoadedConfig};

/// Where an export's bitmaps persist, and what the start found there.
#[derive(Debug, Clone)]
pub struct Persisted {
    pub path: PathBuf,
    /// "restored from a clean shutdown", or why every bitmap is all dirty.
    pub at_start: String,
}

/// Adds export `i`'s bitmaps to `set` (empty): clean, in memory only,
/// without a bitmap file; from it with one. A file that cannot be used
/// (not a bitmap file, unreadable, in a missing directory) is a config
/// error naming the field.
pub(crate) fn restore(
    cfg: &LoadedConfig,
    i: usize,
    e: &ExportConfig,
    set: &DirtyBitmaps,
) -> Result<Option<Persisted>, ConfigError> {
    let field = |m: String| cfg.error_at("export", i, "dirty_bitmap_file", m);
    let Some(path) = &e.dirty_bitmap_file else {
        for name in &e.dirty_bitmaps {
            let added = set.add(name, e.granularity());
            added.map_err(|m| cfg.error_at("export", i, "dirty_bitmaps", m))?;
        }
        return Ok(None);
    };
    let found = dirty_file::read(path).map_err(field)?;
    let done = dirty_file::restore(set, &e.dirty_bitmaps, e.granularity(), &found);
    let done = done.map_err(field)?;
    let (file, at_start) = (path.display().to_string(), done.note);
    if done.all_dirty.is_empty() {
        tracing::info!(export = %e.name, %file, "dirty bitmaps {at_start}");
    } else {
        tracing::warn!(export = %e.name, %file, "dirty bitmaps: {at_start}");
    }
    Ok(Some(Persisted {
        path: path.clone(),
        at_start,
    }))
}

/// An export whose bitmaps persist: its index, name, bitmaps and file.
pub(crate) type PersistedExport<'a> = (usize, &'a str, &'a DirtyBitmaps, &'a Persisted);

/// Rewrites every bitmap file marked in use: from here on the server may
/// mark bits the file does not hold, so a crash must leave it untrusted.
pub(crate) fn mark_in_use<'a>(
    cfg: &LoadedConfig,
    exports: impl Iterator<Item = PersistedExport<'a>>,
) -> Result<(), ConfigError> {
    for (i, _, dirty, p) in exports {
        if let Err(err) = dirty_file::save(&p.path, FileState::InUse, dirty) {
            let msg = format!("cannot write {}: {err}", p.path.display());
            return Err(cfg.error_at("export", i, "dirty_bitmap_file", msg));
        }
    }
    Ok(())
}

/// Saves every bitmap file clean. Call only once no reactor can mark a
/// bit again. A file that cannot be written stays in use, so the next
/// start treats its bitmaps as all dirty; that is logged as an error.
pub(crate) fn save_clean<'a>(exports: impl Iterator<Item = PersistedExport<'a>>) {
    for (_, export, dirty, p) in exports {
        let file = p.path.display().to_string();
        match dirty_file::save(&p.path, FileState::Clean, dirty) {
            Ok(()) => tracing::info!(export, %file, "dirty bitmaps saved"),
            Err(err) => tracing::error!(
                export, %file,
                "dirty bitmaps not saved ({err}): the next start treats them as all dirty"
            ),
        }
    }
}
