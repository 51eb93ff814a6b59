//! A sweep's points on disk: each saved whole as it ends, read back by
//! `--resume`, which reuses them only for the plan they were measured with.

use std::path::Path;

use pace::pacer::CostModel;

use crate::ProbeError;

pub(crate) fn saved<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

pub(crate) fn save<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), ProbeError> {
    let json = serde_json::to_string_pretty(v).map_err(|e| ProbeError::Run(e.to_string()))?;
    // Written whole, then renamed: an interruption leaves no half point.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| ProbeError::Run(format!("{}: {e}", path.display())))
}

/// What a run's saved points were measured with: `--resume` reuses them
/// only for the same device, cost model and path (in process or served),
/// since a point from another would mix two sweeps into one curve.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Plan {
    pub device: String,
    pub served: bool,
    pub cost: CostModel,
}

/// Saves `plan` beside the points, or checks it against the one saved
/// there by the run being resumed.
pub(crate) fn check_plan(dir: &Path, plan: &Plan) -> Result<(), ProbeError> {
    let path = dir.join("plan.json");
    match saved::<Plan>(&path) {
        None => save(&path, plan),
        Some(old) if old == *plan => Ok(()),
        Some(old) => Err(ProbeError::Usage(format!(
            "{}: its points were measured on `{}` {} with {:?}, this run is on `{}` {} with {:?}; \
             run without --resume to measure them again",
            path.display(),
            old.device,
            path_name(old.served),
            old.cost,
            plan.device,
            path_name(plan.served),
            plan.cost
        ))),
    }
}

pub(crate) fn path_name(served: bool) -> &'static str {
    if served {
        "served (nbd)"
    } else {
        "in process"
    }
}

/// A result saved at `path` by an earlier run, or `f`'s, saved there.
pub(crate) fn saved_or<T, F>(path: &Path, f: F) -> Result<T, ProbeError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    F: FnOnce() -> Result<T, ProbeError>,
{
    if let Some(v) = saved(path) {
        return Ok(v);
    }
    let v = f()?;
    save(path, &v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_refuses_points_measured_another_way() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let plan = |served| Plan {
            device: "disk".into(),
            served,
            cost: CostModel::default(),
        };
        check_plan(dir.path(), &plan(false)).expect("the first run saves its plan");
        check_plan(dir.path(), &plan(false)).expect("the same plan resumes");
        let err = check_plan(dir.path(), &plan(true)).expect_err("served after in process");
        assert!(
            matches!(&err, ProbeError::Usage(m) if m.contains("in process") && m.contains("--resume")),
            "{err}"
        );
    }
}
