//! `iopace probe db add|merge|show|import|export`: keep probe results by
//! device model and firmware (the layout is [`config::cost_db`]'s), merge
//! repeated runs into their median and report how far they spread, and
//! trade them with iocost-benchmarks' hwdb files ([`crate::hwdb`]). A key's
//! iocost solutions (a tune result's, or an import's) are kept beside its
//! runs in `iocost.hwdb`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use config::cost_db::{key_dir, DbEntry};
use pace::pacer::CostModel;

use crate::converge::median;
use crate::hwdb;
use crate::iocost::{Centi, ModelParams, QosParams};
use crate::tune_point::TuneResult;
use crate::{ProbeError, ProbeResult};

fn usage(e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Usage(e.to_string())
}

fn run_err(path: &Path, e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Run(format!("{}: {e}", path.display()))
}

/// The file of a key's iocost solutions.
const SOLUTIONS: &str = "iocost.hwdb";

/// Adds every device of a probe's result.json as one run, or a tune
/// result.json's solutions as the key's iocost solutions; returns the
/// files written.
pub fn add(db: &Path, result: &Path) -> Result<Vec<PathBuf>, ProbeError> {
    let text =
        std::fs::read_to_string(result).map_err(|e| usage(format!("{}: {e}", result.display())))?;
    let r: ProbeResult = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(e) => {
            return match serde_json::from_str::<TuneResult>(&text) {
                Ok(t) => add_tune(db, &t).map(|p| vec![p]),
                Err(_) => Err(usage(format!(
                    "{}: neither a probe nor a tune result.json: {e}",
                    result.display()
                ))),
            }
        }
    };
    let mut written = Vec::new();
    for d in &r.devices {
        if d.identity.model.is_empty() {
            return Err(usage(format!("{}: no model identity to key it by", d.name)));
        }
        written.push(write_run(
            db,
            &DbEntry {
                model: d.identity.model.clone(),
                firmware: d.identity.firmware.clone(),
                cost: d.cost,
                knee_qd: d.curves.first().and_then(|c| c.knee_qd),
                runs: 1,
                spread: BTreeMap::new(),
                source: r.command.clone(),
            },
        )?);
    }
    Ok(written)
}

/// Writes one run into its key's directory, under a name no run has.
fn write_run(db: &Path, entry: &DbEntry) -> Result<PathBuf, ProbeError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = key_dir(db, &entry.model, &entry.firmware);
    std::fs::create_dir_all(&dir).map_err(|e| run_err(&dir, e))?;
    let mut path = dir.join(format!("run-{stamp}.json"));
    for n in 1.. {
        if !path.exists() {
            break;
        }
        path = dir.join(format!("run-{stamp}-{n}.json"));
    }
    let json = serde_json::to_string_pretty(entry).map_err(|e| ProbeError::Run(e.to_string()))?;
    std::fs::write(&path, json).map_err(|e| run_err(&path, e))?;
    Ok(path)
}

/// A tune result's solutions, each with the cost model the sweep used, as
/// the iocost solutions of the device's key.
fn add_tune(db: &Path, r: &TuneResult) -> Result<PathBuf, ProbeError> {
    let id = r
        .identity
        .as_ref()
        .filter(|i| !i.model.is_empty())
        .ok_or_else(|| {
            usage(format!(
                "{}: the tune result has no model identity to key it by",
                r.device
            ))
        })?;
    let entry = hwdb::Entry {
        model: id.model.clone(),
        firmware: id.firmware.clone(),
        comment: vec![format!("iopace tune: {}", r.command)],
        solutions: r
            .solutions
            .iter()
            .map(|s| hwdb::Solution {
                name: s.name.clone(),
                model: ModelParams::of(&r.cost),
                qos: crate::tune_report::kernel_qos(r, s).params,
            })
            .collect(),
    };
    write_solutions(db, &entry)
}

fn write_solutions(db: &Path, e: &hwdb::Entry) -> Result<PathBuf, ProbeError> {
    let dir = key_dir(db, &e.model, &e.firmware);
    std::fs::create_dir_all(&dir).map_err(|err| run_err(&dir, err))?;
    let path = dir.join(SOLUTIONS);
    let text = hwdb::print(std::slice::from_ref(e)).map_err(usage)?;
    std::fs::write(&path, text).map_err(|err| run_err(&path, err))?;
    Ok(path)
}

/// Imports an hwdb file: per entry, its solutions as the key's, and the
/// default (first) solution's cost model as one run. Returns the files written.
pub fn import(db: &Path, file: &Path) -> Result<Vec<PathBuf>, ProbeError> {
    let text =
        std::fs::read_to_string(file).map_err(|e| usage(format!("{}: {e}", file.display())))?;
    let entries = hwdb::parse(&text).map_err(|e| usage(format!("{}: {e}", file.display())))?;
    let mut written = Vec::new();
    for e in &entries {
        let first = &e.solutions[0];
        written.push(write_run(
            db,
            &DbEntry {
                model: e.model.clone(),
                firmware: e.firmware.clone(),
                cost: first.model.cost_model(),
                knee_qd: None,
                runs: 1,
                spread: BTreeMap::new(),
                source: format!("hwdb {} ({})", file.display(), first.name),
            },
        )?);
        written.push(write_solutions(db, e)?);
    }
    Ok(written)
}

/// The database as an hwdb file: per key, its iocost solutions if it has
/// any, else one solution, `bandwidth`, of its merged cost model with vrate
/// held at 100% and no latency target.
pub fn export(db: &Path) -> Result<String, ProbeError> {
    let mut entries = Vec::new();
    for (dir, runs) in keys(db)? {
        let path = dir.join(SOLUTIONS);
        if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(|e| run_err(&path, e))?;
            entries.extend(hwdb::parse(&text).map_err(|e| run_err(&path, e))?);
            continue;
        }
        let Some(m) = merge_entries(&runs) else {
            continue;
        };
        let hundred = Centi(10_000);
        entries.push(hwdb::Entry {
            comment: vec![format!(
                "{} run(s); QoS not tuned: vrate held at 100% of the cost model, no latency target",
                m.runs
            )],
            model: m.model,
            firmware: m.firmware,
            solutions: vec![hwdb::Solution {
                name: "bandwidth".into(),
                model: ModelParams::of(&m.cost),
                qos: QosParams {
                    rpct: Centi(0),
                    rlat: 0,
                    wpct: Centi(0),
                    wlat: 0,
                    min: hundred,
                    max: hundred,
                },
            }],
        });
    }
    hwdb::print(&entries).map_err(ProbeError::Run)
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

    #[test]
    fn hwdb_export_imports_back_to_the_same_export() {
        let db = tempfile::tempdir().expect("db");
        // A probed model without solutions: one vrate-100% solution.
        write_run(db.path(), &run(1.0e9, 8)).expect("run");
        let first = export(db.path()).expect("export");
        assert!(
            first.contains("block:*:name:Disk:fwver:1:\n IOCOST_SOLUTIONS=bandwidth\n"),
            "{first}"
        );
        assert!(
            first.contains(
                " IOCOST_QOS_BANDWIDTH=rpct=0.00 rlat=0 wpct=0.00 wlat=0 min=100.00 max=100.00\n"
            ),
            "{first}"
        );
        let file = db.path().join("export.hwdb");
        std::fs::write(&file, &first).expect("write");
        let other = tempfile::tempdir().expect("other db");
        let written = import(other.path(), &file).expect("import");
        assert_eq!(written.len(), 2, "a run and the solutions");
        let second = export(other.path()).expect("export again");
        let entries = |t: &str| hwdb::parse(t).expect("hwdb");
        assert_eq!(entries(&second), entries(&first));
        // The imported run is the cost model serve looks up.
        let (_, e) = config::cost_db::lookup(other.path(), "Disk", "1").expect("looked up");
        assert_eq!(
            ModelParams::of(&e.cost),
            ModelParams::of(&run(1.0e9, 8).cost)
        );
        assert!(import(other.path(), &db.path().join("none")).is_err());
    }
}
