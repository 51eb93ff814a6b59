//! `iopace probe db add|merge|show`: keep probe results by device model and
//! firmware (the layout is [`config::cost_db`]'s), merge repeated runs into
//! their median and report how far they spread.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use config::cost_db::{key_dir, DbEntry};
use pace::pacer::CostModel;

use crate::converge::median;
use crate::{ProbeError, ProbeResult};

fn usage(e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Usage(e.to_string())
}

/// Adds every device of a probe's result.json as one run; returns the files written.
pub fn add(db: &Path, result: &Path) -> Result<Vec<PathBuf>, ProbeError> {
    let text =
        std::fs::read_to_string(result).map_err(|e| usage(format!("{}: {e}", result.display())))?;
    let r: ProbeResult = serde_json::from_str(&text).map_err(|e| {
        usage(format!(
            "{}: not a probe result.json: {e}",
            result.display()
        ))
    })?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut written = Vec::new();
    for d in &r.devices {
        if d.identity.model.is_empty() {
            return Err(usage(format!("{}: no model identity to key it by", d.name)));
        }
        let entry = DbEntry {
            model: d.identity.model.clone(),
            firmware: d.identity.firmware.clone(),
            cost: d.cost,
            knee_qd: d.curves.first().and_then(|c| c.knee_qd),
            runs: 1,
            spread: BTreeMap::new(),
            source: r.command.clone(),
        };
        let dir = key_dir(db, &entry.model, &entry.firmware);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ProbeError::Run(format!("{}: {e}", dir.display())))?;
        let mut path = dir.join(format!("run-{stamp}.json"));
        for n in 1.. {
            if !path.exists() {
                break;
            }
            path = dir.join(format!("run-{stamp}-{n}.json"));
        }
        let json =
            serde_json::to_string_pretty(&entry).map_err(|e| ProbeError::Run(e.to_string()))?;
        std::fs::write(&path, json)
            .map_err(|e| ProbeError::Run(format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

/// The median of each parameter over runs of one model and firmware, with
/// each parameter's spread, (max - min) / median.
pub fn merge_entries(runs: &[DbEntry]) -> Option<DbEntry> {
    let first = runs.first()?;
    let mut values: [Vec<f64>; 6] = Default::default();
    for r in runs {
        for (i, (_, v)) in r.cost.named().into_iter().enumerate() {
            values[i].push(v);
        }
    }
    let names = first.cost.named().map(|p| p.0);
    let mut spread = BTreeMap::new();
    let mut m = [0.0; 6];
    for (i, v) in values.into_iter().enumerate() {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        m[i] = median(&v);
        spread.insert(
            names[i].to_string(),
            if m[i] > 0.0 { (hi - lo) / m[i] } else { 0.0 },
        );
    }
    let knees: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.knee_qd)
        .map(f64::from)
        .collect();
    Some(DbEntry {
        model: first.model.clone(),
        firmware: first.firmware.clone(),
        cost: CostModel {
            rbps: m[0],
            rseqiops: m[1],
            rrandiops: m[2],
            wbps: m[3],
            wseqiops: m[4],
            wrandiops: m[5],
        },
        knee_qd: (!knees.is_empty()).then(|| median(&knees) as u32),
        runs: runs.len() as u32,
        spread,
        source: "merge".into(),
    })
}

/// Every key directory of the database, with its runs (merged.json aside).
fn keys(db: &Path) -> Result<Vec<(PathBuf, Vec<DbEntry>)>, ProbeError> {
    let list = |p: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    if !db.is_dir() {
        return Err(usage(format!(
            "{}: no such database directory",
            db.display()
        )));
    }
    let mut out = Vec::new();
    for model in list(db).into_iter().filter(|p| p.is_dir()) {
        for fw in list(&model).into_iter().filter(|p| p.is_dir()) {
            let mut runs = Vec::new();
            for f in list(&fw) {
                let is_run = f.extension().is_some_and(|x| x == "json")
                    && f.file_name().is_some_and(|n| n != "merged.json");
                if is_run {
                    let text = std::fs::read_to_string(&f)
                        .map_err(|e| usage(format!("{}: {e}", f.display())))?;
                    runs.push(
                        serde_json::from_str(&text)
                            .map_err(|e| usage(format!("{}: {e}", f.display())))?,
                    );
                }
            }
            out.push((fw, runs));
        }
    }
    Ok(out)
}

/// Merges the runs of every key into its merged.json; returns the merges.
pub fn merge(db: &Path) -> Result<Vec<DbEntry>, ProbeError> {
    let mut merged = Vec::new();
    for (dir, runs) in keys(db)? {
        let Some(m) = merge_entries(&runs) else {
            continue;
        };
        let path = dir.join("merged.json");
        let json = serde_json::to_string_pretty(&m).map_err(|e| ProbeError::Run(e.to_string()))?;
        std::fs::write(&path, json)
            .map_err(|e| ProbeError::Run(format!("{}: {e}", path.display())))?;
        merged.push(m);
    }
    Ok(merged)
}

/// A table of every key: its runs, its merged (or only) model, the widest spread.
pub fn show(db: &Path) -> Result<String, ProbeError> {
    let costs = CostModel::default()
        .named()
        .map(|(name, _)| name)
        .join(" | ");
    let mut t = format!("model | firmware | runs | {costs} | knee QD | widest spread\n");
    for (_, runs) in keys(db)? {
        let Some(m) = merge_entries(&runs) else {
            continue;
        };
        let (worst, s) = m
            .spread
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(("-", 0.0), |(k, v)| (k.as_str(), *v));
        let costs = m.cost.named().map(|(_, v)| format!("{v:.0}")).join(" | ");
        let _ = writeln!(
            t,
            "{} | {} | {} | {costs} | {} | {worst} {:.1}%",
            m.model,
            m.firmware,
            m.runs,
            m.knee_qd.map_or("-".into(), |k| k.to_string()),
            100.0 * s
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rbps: f64, knee: u32) -> DbEntry {
        DbEntry {
            model: "Disk".into(),
            firmware: "1".into(),
            cost: CostModel {
                rbps,
                ..CostModel::nvme()
            },
            knee_qd: Some(knee),
            runs: 1,
            spread: BTreeMap::new(),
            source: "t".into(),
        }
    }

    #[test]
    fn merge_takes_medians_and_reports_spread() {
        let m = merge_entries(&[run(1.0e9, 8), run(1.2e9, 16), run(0.9e9, 8)]).expect("merged");
        assert_eq!(m.runs, 3);
        assert_eq!(m.cost.rbps, 1.0e9);
        assert_eq!(m.knee_qd, Some(8));
        assert!((m.spread["rbps"] - 0.3).abs() < 1e-9, "{:?}", m.spread);
        assert_eq!(m.spread["rrandiops"], 0.0);
        assert!(merge_entries(&[]).is_none());
    }
}
