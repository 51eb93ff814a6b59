//! The swept `jobs` variable: which exports a point's fio jobs read, each
//! at its own queue depth, e.g. "gold:32 bronze:32", "gold:1 bronze:32",
//! then "gold:1" alone, so a tenant pair and each tenant's solo run are
//! points of one sweep (the solo runs a QD 1 tenant's p99 and a
//! saturating tenant's rate are judged against).

use super::Workload;

/// "EXPORT[:QD] ...": each export, and its queue depth if given; None if
/// the text is no such list.
pub fn parse(text: &str) -> Option<Vec<(String, Option<u32>)>> {
    let jobs: Option<Vec<(String, Option<u32>)>> = text
        .split_whitespace()
        .map(|job| match job.split_once(':') {
            None => Some((job.to_string(), None)),
            Some((export, qd)) => {
                let qd = qd.parse::<u32>().ok().filter(|&q| q > 0)?;
                Some((export.to_string(), Some(qd)))
            }
        })
        .collect();
    jobs.filter(|j| !j.is_empty() && j.iter().all(|(e, _)| !e.is_empty()))
}

/// Puts `text`'s exports and queue depths in `w` (checked at load).
pub fn apply(w: &mut Workload, text: &str) {
    let Some(jobs) = parse(text) else { return };
    w.exports = jobs.iter().map(|(e, _)| e.clone()).collect();
    w.iodepth_of = jobs
        .into_iter()
        .filter_map(|(e, qd)| Some((e, qd?)))
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_name_exports_and_their_depths() {
        assert_eq!(
            parse("gold:1  bronze:32 x"),
            Some(vec![
                ("gold".into(), Some(1)),
                ("bronze".into(), Some(32)),
                ("x".into(), None)
            ])
        );
        for bad in ["", "gold:0", "gold:x", ":4", "gold:-1"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
