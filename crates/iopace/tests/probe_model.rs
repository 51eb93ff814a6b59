//! `iopace probe` against `model` bdevs: it runs to the end and writes all
//! six cost parameters, a knee, the report and the plot; writes are refused
//! where they would destroy data; the results database merges runs and
//! `serve` takes its cost model from it.
//!
//! How close the parameters come to the models' truth is not asserted here:
//! on a wall clock it depends on the machine's load. The search and fit are
//! checked exactly against the model's timing in virtual time
//! (`crates/probe/src/run_model_tests.rs`), and the real probe's accuracy
//! and duration are a benchmark (`scripts/probe-accuracy.sh`, BENCHMARKS.md).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{run, BIN};

/// The shapes (256 channels) whose knees the unit test in
/// crates/probe/src/run_model_tests.rs checks in virtual time (QD 2, 4, 8).
const DEVICES: [common::ModelShape; 3] = [
    // service 220 us, + 100 us latency. (At 4,500 IOPS a debug build keeps
    // up even on a loaded machine.)
    common::model("fast", "rbps = 200e6, rseqiops = 10000, rrandiops = 5000, wbps = 100e6, wseqiops = 5000, wrandiops = 2500", 100, 256, 0, 0),
    // service 1041 us, + 2 ms.
    common::model("slow", "rbps = 100e6, rseqiops = 3000, rrandiops = 1000, wbps = 100e6, wseqiops = 2000, wrandiops = 800", 2000, 256, 0, 0),
    // service 264 us, + 1 ms, + 100 us per IO past 8.
    common::model("knee", "rbps = 300e6, rseqiops = 8000, rrandiops = 4000, wbps = 200e6, wseqiops = 6000, wrandiops = 3000", 1000, 256, 8, 100),
];

fn config(dir: &Path) -> std::path::PathBuf {
    common::model_config(dir, "models.toml", &DEVICES)
}

/// QD up to 64: the curves' QDs are also the range each cost point's peak
/// is searched over, and a debug build's timer overhead on a loaded machine
/// costs a QD of 16 5-17% of these devices' rates (docs/evidence.md#probe-peak-qd).
fn probe(config: &Path, name: &str, out: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "probe",
        "--quick",
        "--max-qd",
        "64",
        "--threads",
        "1",
        "--config",
    ])
    .arg(config)
    .arg(name)
    .arg("--out")
    .arg(out);
    cmd
}

#[test]
fn probe_writes_every_parameter_and_a_knee_for_each_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    // The devices are timer-paced, not CPU-bound: probe them side by side.
    let handles: Vec<_> = DEVICES
        .iter()
        .map(|d| {
            let (cfg, out) = (cfg.clone(), dir.path().join(d.name));
            std::thread::spawn(move || {
                run(&mut probe(&cfg, d.name, &out), Duration::from_secs(120))
            })
        })
        .collect();
    for (h, shape) in handles.into_iter().zip(DEVICES) {
        let common::ModelShape { name, cost, .. } = shape;
        h.join().expect("probe thread");
        let text = std::fs::read_to_string(dir.path().join(name).join("result.json"))
            .expect("result.json");
        let r: serde_json::Value = serde_json::from_str(&text).expect("json");
        let dev = &r["devices"][0];
        for (param, _) in common::cost_truth(cost) {
            let got = dev["cost"][&param].as_f64().expect("number");
            assert!(got.is_finite() && got > 0.0, "{name}: {param} = {got}");
        }
        // The knee is one of the curve's QDs (powers of two up to 64).
        let knee = dev["curves"][0]["knee_qd"].as_u64().expect("a knee");
        assert!(
            knee.is_power_of_two() && knee <= 64,
            "{name}: knee QD {knee}"
        );
        let report =
            std::fs::read_to_string(dir.path().join(name).join("report.md")).expect("report");
        assert!(report.contains(&format!("[cost.{name}]")), "{report}");
        assert!(dir
            .path()
            .join(name)
            .join(format!("{name}-qd.png"))
            .exists());
    }
}

#[test]
fn writes_are_refused_where_they_destroy_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    let mut data = vec![0u8; 4 << 20];
    data[1080] = 0x53;
    data[1081] = 0xEF;
    std::fs::write(&img, &data).expect("write image");
    let out = Command::new(BIN)
        .args(["probe", "--quick", "--destructive"])
        .arg(&img)
        .arg(&img)
        .output()
        .expect("run probe");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ext2/3/4 filesystem") && err.contains("refusing"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&img).expect("read"),
        data,
        "the image is untouched"
    );
}

/// Runs iopace with `args`; it must exit 2 and say all of `says` on stderr.
fn refused(args: &[&std::ffi::OsStr], says: &[&str]) {
    let out = Command::new(BIN).args(args).output().expect("run iopace");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for s in says {
        assert!(err.contains(s), "{args:?}: `{s}` not in: {err}");
    }
}

/// Bad input gets a clear error and exit status 2 before any IO: an unknown
/// device or bdev name, a bad spec file, a bad config. (A mounted block
/// device is refused by `safety`'s unit test, which only reads.)
#[test]
fn bad_input_exits_2_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let os = |s: &str| std::ffi::OsString::from(s);
    let (cfg, dir) = (cfg.into_os_string(), dir.path().to_path_buf());
    for cmd in ["probe", "tune"] {
        refused(
            &[&os(cmd), &os("--quick"), &os("/nonexistent/disk")],
            &["/nonexistent/disk", "no such block device or file"],
        );
        refused(
            &[&os(cmd), &os("--quick"), &os("-c"), &cfg, &os("nosuch")],
            &[
                "nosuch",
                "neither a bdev of the config nor an existing path",
            ],
        );
    }
    let spec = dir.join("spec.toml");
    std::fs::write(&spec, "name = \"x\"\nrand_read_iops = -5\n").expect("write spec");
    let out = dir.join("out").into_os_string();
    let with_spec = [
        os("probe"),
        os("--quick"),
        os("-c"),
        cfg.clone(),
        os("fast"),
        os("--spec"),
        spec.clone().into_os_string(),
        os("--out"),
        out,
    ];
    let with_spec: Vec<_> = with_spec.iter().map(|s| s.as_os_str()).collect();
    refused(
        &with_spec,
        &["spec.toml:2", "rand_read_iops", "must be a positive number"],
    );
    std::fs::write(&spec, "rand_read_iop = 5\n").expect("write spec");
    refused(&with_spec, &["spec error", "rand_read_iop"]);
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[bdev]]\nname = \"m\"\nkind = \"model\"\nbase = \"none\"\n",
    )
    .expect("write config");
    for cmd in ["probe", "tune"] {
        refused(
            &[
                &os(cmd),
                &os("--quick"),
                &os("-c"),
                bad.as_os_str(),
                &os("m"),
            ],
            &["config error", "bad.toml"],
        );
    }
}
