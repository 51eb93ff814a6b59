//! The datasheet check: a vendor's rated numbers (SPEC.toml) against what
//! the probe measured, as "% of spec".

use std::path::Path;

use crate::{DeviceResult, MultiDevice, ProbeError};

/// A datasheet's numbers; any may be left out.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rated {
    /// Whose numbers these are, e.g. the drive's name on the datasheet.
    #[serde(default)]
    pub name: String,
    pub seq_read_mbps: Option<f64>,
    pub seq_write_mbps: Option<f64>,
    pub rand_read_iops: Option<f64>,
    pub rand_write_iops: Option<f64>,
    /// 4 KiB random, 70% reads.
    pub mixed_70_30_iops: Option<f64>,
    pub rand_read_8k_iops: Option<f64>,
    pub rand_write_8k_iops: Option<f64>,
}

/// One line of the "% of spec" table.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpecRow {
    pub metric: String,
    pub rated: f64,
    pub measured: Option<f64>,
    pub percent: Option<f64>,
}

/// Reads and checks a SPEC.toml; errors name the file, line and field.
pub fn load(path: &Path) -> Result<Rated, ProbeError> {
    let text = config::read_text(path).map_err(|e| ProbeError::Usage(e.to_string()))?;
    let rated: Rated = config::from_toml(&text, &path.display().to_string())
        .map_err(|e| ProbeError::Usage(format!("spec error: {e}")))?;
    for (field, v) in [
        ("seq_read_mbps", rated.seq_read_mbps),
        ("seq_write_mbps", rated.seq_write_mbps),
        ("rand_read_iops", rated.rand_read_iops),
        ("rand_write_iops", rated.rand_write_iops),
        ("mixed_70_30_iops", rated.mixed_70_30_iops),
        ("rand_read_8k_iops", rated.rand_read_8k_iops),
        ("rand_write_8k_iops", rated.rand_write_8k_iops),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            let line = text
                .lines()
                .position(|l| l.split_once('=').is_some_and(|(k, _)| k.trim() == field));
            let at = line.map_or(String::new(), |l| format!(":{}", l + 1));
            return Err(ProbeError::Usage(format!(
                "spec error: {}{at}: field `{field}`: must be a positive number",
                path.display()
            )));
        }
    }
    Ok(rated)
}

fn best(d: &DeviceResult, label: &str) -> Option<f64> {
    let c = d.curves.iter().find(|c| c.label == label)?;
    c.points.iter().map(|p| p.m.iops).reduce(f64::max)
}

fn row(d: &DeviceResult, label: &str) -> Option<f64> {
    d.cost_points
        .iter()
        .find(|p| p.0 == label)
        .map(|p| p.3.iops)
}

/// The table: each rated number beside the measured one, and with several
/// devices probed, their 4 KiB random reads at once against the rated sum.
pub fn compare(r: &Rated, d: &DeviceResult, many: Option<&MultiDevice>) -> Vec<SpecRow> {
    let seq_write = d
        .cost_points
        .iter()
        .find(|p| p.0 == format!("seq write {}KiB", crate::fit::LARGE >> 10))
        .map(|p| p.3.bytes_per_s / 1e6);
    let seq_read = best(d, "128KiB sequential read").map(|iops| iops * 131072.0 / 1e6);
    let many_row = many.map(|m| {
        (
            format!(
                "4 KiB random read IOPS, {} devices at once",
                m.devices.len()
            ),
            r.rand_read_iops.map(|x| x * m.devices.len() as f64),
            Some(m.together.iops),
        )
    });
    let rows = [
        (
            "sequential read MB/s (128 KiB)".to_string(),
            r.seq_read_mbps,
            seq_read,
        ),
        (
            "sequential write MB/s (128 KiB)".into(),
            r.seq_write_mbps,
            seq_write,
        ),
        (
            "4 KiB random read IOPS".into(),
            r.rand_read_iops,
            best(d, "4KiB random read"),
        ),
        (
            "4 KiB random write IOPS".into(),
            r.rand_write_iops,
            best(d, "4KiB random write"),
        ),
        (
            "8 KiB random read IOPS (QD 64)".into(),
            r.rand_read_8k_iops,
            row(d, "rand read 8KiB"),
        ),
        (
            "8 KiB random write IOPS (QD 64)".into(),
            r.rand_write_8k_iops,
            row(d, "rand write 8KiB"),
        ),
        (
            "4 KiB random 70/30 IOPS (QD 64)".into(),
            r.mixed_70_30_iops,
            row(d, "70/30 random 4KiB"),
        ),
    ];
    rows.into_iter()
        .chain(many_row)
        .filter_map(|(metric, rated, measured)| {
            let rated = rated?;
            Some(SpecRow {
                metric,
                rated,
                measured,
                percent: measured.map(|m| 100.0 * m / rated),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_spec_names_file_line_and_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("spec.toml");
        std::fs::write(&p, "name = \"x\"\nrand_read_iops = -5\n").expect("write");
        let ProbeError::Usage(e) = load(&p).unwrap_err() else {
            panic!("a usage error");
        };
        assert!(e.contains("spec.toml:2: field `rand_read_iops`"), "{e}");
        std::fs::write(&p, "rand_reed_iops = 5\n").expect("write");
        let ProbeError::Usage(e) = load(&p).unwrap_err() else {
            panic!("a usage error");
        };
        assert!(e.contains("rand_reed_iops"), "{e}");
        std::fs::write(&p, "seq_read_mbps = 3500\n").expect("write");
        assert_eq!(load(&p).expect("valid").seq_read_mbps, Some(3500.0));
    }

    #[test]
    fn the_table_has_the_datasheet_points_and_many_devices() {
        use crate::driver::{Measurement, Workload};
        let w = Workload {
            read_pct: 100,
            bs: 8192,
            random: true,
            alt_bs: None,
        };
        let at = |iops: f64| Measurement {
            iops,
            ..Measurement::default()
        };
        let d = DeviceResult {
            name: "d".into(),
            identity: Default::default(),
            cost: Default::default(),
            cost_points: vec![
                ("rand read 8KiB".into(), w, 64, at(500.0)),
                ("70/30 random 4KiB".into(), w, 64, at(900.0)),
            ],
            round_iops: Vec::new(),
            qd_search: Vec::new(),
            write_refusal: None,
            line_dev: None,
            curves: Vec::new(),
            thread_scaling: Vec::new(),
            predictions: Vec::new(),
            spec: None,
            cost_s: 0.0,
            elapsed_s: 0.0,
            phases: Default::default(),
        };
        let rated = Rated {
            rand_read_iops: Some(1000.0),
            rand_read_8k_iops: Some(1000.0),
            rand_write_8k_iops: Some(800.0),
            mixed_70_30_iops: Some(1000.0),
            ..Rated::default()
        };
        let many = MultiDevice {
            devices: vec!["d".into(), "e".into()],
            sum_alone_iops: 2000.0,
            together: at(1500.0),
        };
        let rows = compare(&rated, &d, Some(&many));
        let get = |m: &str| rows.iter().find(|r| r.metric.starts_with(m)).expect(m);
        assert_eq!(get("8 KiB random read").percent, Some(50.0));
        assert_eq!(get("8 KiB random write").measured, None, "not measured");
        assert_eq!(get("4 KiB random 70/30").percent, Some(90.0));
        let all = get("4 KiB random read IOPS, 2 devices at once");
        assert_eq!((all.rated, all.percent), (2000.0, Some(75.0)));
        assert_eq!(compare(&rated, &d, None).len(), rows.len() - 1);
    }
}
