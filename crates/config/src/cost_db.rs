//! The cost database: probe results keyed by device model and firmware, one
//! directory per key, as iocost-benchmarks keeps them. `iopace probe db`
//! writes it; `iopace serve` reads a bdev's cost model from it when the
//! config gives the bdev no `[cost.NAME]`.
//!
//! Layout: `DB/<model>/<firmware>/<run>.json` for each run added, and
//! `merged.json` beside them once runs are merged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bdev::identity::{self, Identity};
use bdev::{Bdev, BdevKind, BdevKindName, BdevSpec};
use pace::pacer::CostModel;

/// One run, or the merge of several, for one model and firmware.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DbEntry {
    pub model: String,
    pub firmware: String,
    pub cost: CostModel,
    /// The 4 KiB random-read knee, when the run measured it.
    pub knee_qd: Option<u32>,
    /// Runs behind this entry (1 for a single run).
    pub runs: u32,
    /// Per parameter, (max - min) / median over the runs merged.
    #[serde(default)]
    pub spread: BTreeMap<String, f64>,
    /// Where the run came from (the probe's command, or "merge").
    pub source: String,
}

/// A path component from free text: model names hold spaces and slashes.
pub fn slug(text: &str) -> String {
    let s: String = text
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        "unknown".into()
    } else {
        s
    }
}

/// The directory of one model and firmware.
pub fn key_dir(db: &Path, model: &str, firmware: &str) -> PathBuf {
    db.join(slug(model)).join(slug(firmware))
}

/// The entry for a device: the merge if there is one, else the latest run.
pub fn lookup(db: &Path, model: &str, firmware: &str) -> Option<(PathBuf, DbEntry)> {
    let dir = key_dir(db, model, firmware);
    let merged = dir.join("merged.json");
    let path = if merged.exists() {
        merged
    } else {
        let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        runs.sort();
        runs.pop()?
    };
    let text = std::fs::read_to_string(&path).ok()?;
    let entry = serde_json::from_str(&text).ok()?;
    Some((path, entry))
}

/// The file under a bdev of a config, following `base` down the stack.
pub fn leaf_path(specs: &[BdevSpec], name: &str) -> Option<String> {
    let mut name = name.to_string();
    for _ in 0..=specs.len() {
        let s = specs.iter().find(|s| s.name == name).or_else(|| {
            // A split part `NAMEpK` belongs to split NAME.
            specs
                .iter()
                .find(|s| s.kind_name() == BdevKindName::Split && name.starts_with(&s.name))
        })?;
        if let BdevKind::File { path, .. } = &s.kind {
            return Some(path.clone());
        }
        name = s.base()?.to_string();
    }
    None
}

/// Who a bdev of a config is: the device under its file, or itself.
pub fn identity_of(specs: &[BdevSpec], name: &str, dev: &Bdev) -> Identity {
    match leaf_path(specs, name) {
        Some(path) if dev.kind() == "file" => identity::of_path(Path::new(&path), dev),
        _ => identity::of_bdev(dev),
    }
}

/// A bdev's cost model from the database, logged with the entry it came from.
pub fn cost_for(db: &Path, specs: &[BdevSpec], name: &str, dev: &Bdev) -> Option<CostModel> {
    let id = identity_of(specs, name, dev);
    let Some((path, entry)) = lookup(db, &id.model, &id.firmware) else {
        tracing::info!(
            bdev = name,
            model = id.model,
            firmware = id.firmware,
            "no cost model in the database {}; using the default for its kind",
            db.display()
        );
        return None;
    };
    tracing::info!(
        bdev = name,
        model = entry.model,
        firmware = entry.firmware,
        runs = entry.runs,
        "cost model from the database: {}",
        path.display()
    );
    Some(entry.cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_safe_path_components() {
        assert_eq!(slug("Samsung SSD 980 PRO 1TB"), "Samsung_SSD_980_PRO_1TB");
        assert_eq!(slug("../x"), ".._x");
        assert_eq!(slug(".."), "unknown");
        assert_eq!(slug(""), "unknown");
    }

    #[test]
    fn lookup_prefers_the_merge_then_the_latest_run() {
        let db = tempfile::tempdir().expect("tempdir");
        let dir = key_dir(db.path(), "Disk X", "1.0");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let entry = |runs: u32, rbps: f64| DbEntry {
            model: "Disk X".into(),
            firmware: "1.0".into(),
            cost: CostModel {
                rbps,
                ..CostModel::nvme()
            },
            knee_qd: Some(8),
            runs,
            spread: BTreeMap::new(),
            source: "test".into(),
        };
        assert!(lookup(db.path(), "Disk X", "1.0").is_none());
        let write = |name: &str, e: &DbEntry| {
            std::fs::write(dir.join(name), serde_json::to_string(e).expect("json")).expect("write")
        };
        write("run-1.json", &entry(1, 1e9));
        write("run-2.json", &entry(1, 2e9));
        assert_eq!(
            lookup(db.path(), "Disk X", "1.0")
                .expect("found")
                .1
                .cost
                .rbps,
            2e9
        );
        write("merged.json", &entry(2, 1.5e9));
        assert_eq!(lookup(db.path(), "Disk X", "1.0").expect("found").1.runs, 2);
        assert!(lookup(db.path(), "Disk X", "2.0").is_none());
    }
}
