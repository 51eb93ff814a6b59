//! The Linux iocost lines from `probe` and `tune` against `model` bdevs:
//! each cost point's peak QD is searched and all six parameters are written
//! in the kernel's `io.cost.model` form (how close they come to the model's
//! is checked in virtual time by crates/probe/src/run_model_tests.rs, and
//! on a real clock by the benchmark scripts/probe-accuracy.sh); `--apply`
//! writes the lines into a directory standing in for a cgroup2 root (this
//! machine's io controller is on cgroup v1) and says why not where there
//! is no iocost file or no device number; `probe db` exports and imports
//! them as iocost-benchmarks' hwdb.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{run, BIN};

/// (name, cost table, latency_us, channels, knee_qd, knee_us). Slow enough
/// for a debug build on a loaded machine (a tenth of the rates of
/// docs/evidence.md#probe-peak-qd's shapes, ten times the latencies).
const SHAPES: [common::ModelShape; 2] = [
    // The drive: latency grows 300 us per IO past QD 24, so 4 KiB
    // sequential reads reach their 9,000 IOPS only between QD 8 and 32
    // (at QD 64 they gave -36%).
    common::model("knee", "rbps = 120e6, rseqiops = 9000, rrandiops = 4000, wbps = 40e6, wseqiops = 3000, wrandiops = 900", 700, 64, 24, 300),
    // Four channels: the rates need QD 3-4, more only queue.
    common::model("few", "rbps = 40e6, rseqiops = 2000, rrandiops = 1000, wbps = 20e6, wseqiops = 1000, wrandiops = 500", 1000, 4, 0, 0),
];

/// A directory standing in for the root of a cgroup2 hierarchy with iocost.
fn cgroup2_root(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("cgroup2");
    std::fs::create_dir_all(&root).expect("mkdir");
    for f in [
        "cgroup.controllers",
        "cgroup.procs",
        "io.cost.model",
        "io.cost.qos",
    ] {
        std::fs::write(root.join(f), "").expect("stand-in file");
    }
    root
}

/// `key=value` of a line's token `key`.
fn value(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {line}"))
        .parse()
        .expect("number")
}

fn probe(cfg: &Path, name: &str, out: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["probe", "--quick", "--max-qd", "64", "--threads", "1", "-c"])
        .arg(cfg)
        .arg(name)
        .arg("--out")
        .arg(out);
    cmd
}

#[test]
fn probe_finds_each_peak_and_writes_the_kernels_model_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = common::model_config(dir.path(), "shapes.toml", &SHAPES);
    let root = cgroup2_root(dir.path());
    // The knee device with a device number, applied; the other without.
    let mut knee = probe(&cfg, "knee", &dir.path().join("knee"));
    knee.args(["--devnum", "259:0", "--apply"]).arg(&root);
    let mut few = probe(&cfg, "few", &dir.path().join("few"));
    few.arg("--apply").arg(&root);
    // Timer-paced devices: side by side.
    let handles: Vec<_> = [knee, few]
        .into_iter()
        .map(|mut c| std::thread::spawn(move || c.output().expect("run probe")))
        .collect();
    let outs: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("probe thread"))
        .collect();
    assert!(outs[0].status.success(), "{:?}", outs[0]);
    let stdout = String::from_utf8_lossy(&outs[0].stdout);
    assert!(
        stdout.contains("applied ") && stdout.contains("io.cost.model"),
        "{stdout}"
    );
    // No device number for a model bdev: said, not applied; the results stand.
    assert_eq!(outs[1].status.code(), Some(1), "{:?}", outs[1]);
    let err = String::from_utf8_lossy(&outs[1].stderr);
    assert!(
        err.contains("placeholder") && err.contains("--devnum"),
        "{err}"
    );
    for common::ModelShape { name, cost, .. } in SHAPES {
        let out = dir.path().join(name);
        let line = std::fs::read_to_string(out.join("io.cost.model")).expect("io.cost.model");
        let line = line.trim_end();
        let dev = if name == "knee" { "259:0" } else { "0:0" };
        assert!(
            line.starts_with(&format!("{dev} ctrl=user model=linear rbps=")),
            "{line}"
        );
        let report = std::fs::read_to_string(out.join("report.md")).expect("report");
        assert!(
            report.contains(line) && report.contains("### Peak QD of each cost point"),
            "{report}"
        );
        for (param, _) in common::cost_truth(cost) {
            let got = value(line, &param);
            assert!(got.is_finite() && got > 0.0, "{name}: {param} = {got}");
        }
    }
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("knee/result.json")).expect("result"),
    )
    .expect("json");
    let search = r["devices"][0]["qd_search"].as_array().expect("qd_search");
    let seq = search
        .iter()
        .find(|t| t["label"] == "seq read 4KiB")
        .expect("seq read 4KiB");
    // The peak is a QD the search measured (where, depends on the clock).
    let qd = seq["qd"].as_u64().expect("qd");
    let tried = seq["tried"].as_array().expect("tried");
    assert!(tried.iter().any(|t| t[0] == qd), "peak QD {qd}: {seq}");
    let applied = std::fs::read_to_string(root.join("io.cost.model")).expect("applied");
    assert!(
        applied.starts_with("259:0 ctrl=user model=linear rbps="),
        "{applied}"
    );
}

#[test]
fn tune_writes_and_applies_the_kernels_qos_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("tune.toml");
    std::fs::write(
        &cfg,
        "[[bdev]]\nname = \"base\"\nkind = \"null\"\nsize = \"1GiB\"\n\n\
         [[bdev]]\nname = \"dev\"\nkind = \"model\"\nbase = \"base\"\n\
         cost = { rbps = 400e6, rseqiops = 10000, rrandiops = 5000, wbps = 200e6, wseqiops = 8000, wrandiops = 4000 }\n\
         latency_us = 200\n\n[[export]]\nname = \"dev\"\nbdev = \"dev\"\n\n\
         [cost.dev]\nrbps = 400e6\nrseqiops = 10000\nrrandiops = 5000\nwbps = 200e6\nwseqiops = 8000\nwrandiops = 4000\n",
    )
    .expect("config");
    let root = cgroup2_root(dir.path());
    // This machine's cgroup2 mount has no iocost: the stand-in without io.cost.qos.
    std::fs::remove_file(root.join("io.cost.qos")).expect("rm");
    let out = dir.path().join("tune");
    let tune = |extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args([
            "tune",
            "--quick",
            "--solution",
            "bandwidth",
            "--devnum",
            "8:16",
            "-c",
        ])
        .arg(&cfg)
        .arg("dev")
        .arg("--out")
        .arg(&out)
        .arg("--apply")
        .arg(&root)
        .args(extra);
        c
    };
    let done = tune(&[]).output().expect("run tune");
    assert_eq!(done.status.code(), Some(1), "{done:?}");
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(err.contains("has no io.cost.qos"), "{err}");
    let qos = std::fs::read_to_string(out.join("io.cost.qos")).expect("io.cost.qos");
    assert!(
        qos.starts_with("8:16 enable=1 ctrl=user rpct=0.00 rlat="),
        "{qos}"
    );
    assert_eq!(value(&qos, "min"), value(&qos, "max"), "vrate held: {qos}");
    let model = std::fs::read_to_string(out.join("io.cost.model")).expect("io.cost.model");
    assert_eq!(
        model,
        "8:16 ctrl=user model=linear rbps=400000000 rseqiops=10000 rrandiops=5000 wbps=200000000 wseqiops=8000 wrandiops=4000\n"
    );
    // With the file there, both are written: the model first.
    std::fs::write(root.join("io.cost.qos"), "").expect("stand-in");
    let again = run(&mut tune(&["--resume"]), Duration::from_secs(120));
    assert!(String::from_utf8_lossy(&again.stdout).contains("applied"));
    assert_eq!(
        std::fs::read_to_string(root.join("io.cost.qos")).expect("qos"),
        qos
    );
    assert_eq!(
        std::fs::read_to_string(root.join("io.cost.model")).expect("model"),
        model
    );
}
