//! The dirty bitmap RPCs: `add_dirty_bitmap`, `remove_dirty_bitmap`,
//! `clear_dirty_bitmap` and `get_dirty_bitmaps`. Control plane: the export's
//! bitmap list takes a lock here; the reactors see a change at their next
//! write to that export (`bdev::dirty::DirtyMarks`).

use std::sync::Arc;

use bdev::dirty::DirtyBitmap;
use serde_json::{json, Value};

use crate::exports::{Catalog, Export};

pub struct DirtyControl {
    catalog: Arc<Catalog>,
}

/// A bitmap as the RPCs show it; with its export's bitmap file, where it
/// persists and what the start found there.
fn describe(e: &Export, b: &DirtyBitmap) -> Value {
    let mut v = json!({
        "export": e.info.name,
        "name": b.name(),
        "context": format!("{}{}", proto::DIRTY_BITMAP_PREFIX, b.name()),
        "granularity": b.granularity(),
        "size": b.size(),
        "dirty_bytes": b.dirty_bytes(),
    });
    if let Some(p) = &e.persisted {
        v["file"] = json!(p.path.display().to_string());
        v["at_start"] = json!(p.at_start);
    }
    v
}

fn text<'a>(params: &'a Value, key: &str) -> Result<&'a str, String> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("params need \"{key}\": a string"))
}

impl DirtyControl {
    pub fn new(catalog: Arc<Catalog>) -> DirtyControl {
        DirtyControl { catalog }
    }

    fn export(&self, params: &Value) -> Result<&Export, String> {
        let name = text(params, "export")?;
        let found = self.catalog.exports.iter().find(|e| e.info.name == name);
        found.ok_or_else(|| format!("no export named `{name}`"))
    }

    /// `{export, name, granularity?}`: a new, clean bitmap.
    pub fn add(&self, params: &Value) -> Result<Value, String> {
        let e = self.export(params)?;
        let granularity = match params.get("granularity") {
            None | Some(Value::Null) => e.granularity,
            Some(g) => g.as_u64().ok_or("\"granularity\" is a number of bytes")?,
        };
        let b = e.dirty.add(text(params, "name")?, granularity)?;
        tracing::info!(export = %e.info.name, bitmap = b.name(), granularity, "dirty bitmap added");
        Ok(describe(e, &b))
    }

    /// `{export, name}`: the bitmap goes; connections that selected it see
    /// it all dirty from now on.
    pub fn remove(&self, params: &Value) -> Result<Value, String> {
        let e = self.export(params)?;
        let name = text(params, "name")?;
        e.dirty.remove(name)?;
        tracing::info!(export = %e.info.name, bitmap = name, "dirty bitmap removed");
        Ok(json!({ "export": e.info.name, "name": name, "removed": true }))
    }

    /// `{export, name, snapshot?}`: every block clean (a new incremental
    /// starts); answers with the dirty bytes it had. With `snapshot`, what
    /// it had moves atomically into a new bitmap of that name, for the
    /// backup to copy (then remove).
    pub fn clear(&self, params: &Value) -> Result<Value, String> {
        let e = self.export(params)?;
        let name = text(params, "name")?;
        if params.get("snapshot").is_some_and(|s| !s.is_null()) {
            let snap = e.dirty.snapshot(name, text(params, "snapshot")?)?;
            tracing::info!(export = %e.info.name, bitmap = name, snapshot = snap.name(), "dirty bitmap cleared into a snapshot");
            let cleared = snap.dirty_bytes();
            let snapshot = describe(e, &snap);
            return Ok(
                json!({ "export": e.info.name, "name": name, "cleared_bytes": cleared, "snapshot": snapshot }),
            );
        }
        let b = (e.dirty.get(name)).ok_or_else(|| format!("no dirty bitmap `{name}`"))?;
        let before = b.dirty_bytes();
        b.clear();
        Ok(json!({ "export": e.info.name, "name": name, "cleared_bytes": before }))
    }

    /// `{export?}`: every bitmap (of that export), with its dirty bytes.
    pub fn get(&self, params: &Value) -> Result<Value, String> {
        let only = match params.get("export") {
            None | Some(Value::Null) => None,
            Some(_) => Some(self.export(params)?.info.name.as_str()),
        };
        let exports = self.catalog.exports.iter();
        let wanted = exports.filter(|e| only.is_none_or(|n| n == e.info.name));
        let all: Vec<Value> = wanted
            .flat_map(|e| {
                e.dirty
                    .all()
                    .iter()
                    .map(|b| describe(e, b))
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Value::Array(all))
    }
}
