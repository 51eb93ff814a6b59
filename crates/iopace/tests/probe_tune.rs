//! `iopace tune` against a `model` bdev of known truth
//! (`scripts/tune-knee.toml`): tune runs, writes its points, result, report
//! and plot, names its solutions, and an interrupted sweep keeps its
//! finished points and `--resume` completes it without redoing them.
//! How close its bandwidth solution comes to the model's knee (vrate 125%)
//! is a speed measurement, so it is a benchmark (`scripts/tune-knee.sh`,
//! docs/evidence.md#tune-knee), not asserted here.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{run, BIN};

/// Each test runs tune's measurements on the machine's cores: one at a
/// time, so that they do not slow each other past their time limits.
static ALONE: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

const CONFIG: &str = include_str!("../../../scripts/tune-knee.toml");

#[test]
fn tune_writes_its_results_and_resumes() {
    let _alone = alone();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("tune.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let out = dir.path().join("tune");
    let tune = || {
        let mut c = Command::new(BIN);
        c.args(["tune", "--quick", "-c"])
            .arg(&cfg)
            .arg("dev")
            .arg("--out")
            .arg(&out);
        c
    };
    // Interrupted once its first vrate point is saved.
    let mut child = tune()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn tune");
    let first = out.join("points").join("depth-032.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !first.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("kill tune");
    child.wait().expect("reap tune");
    let saved = std::fs::read_to_string(&first).expect("the first point survives");

    let done = run(tune().arg("--resume"), Duration::from_secs(120));
    assert_eq!(
        std::fs::read_to_string(&first).expect("point"),
        saved,
        "resume kept the point"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).expect("result"))
            .expect("json");
    assert!(r["points"].as_array().expect("points").len() >= 4, "{r}");
    // A bandwidth solution within the vrates swept (where it lies is
    // scripts/tune-knee.sh's to measure).
    let bandwidth = &r["solutions"][0];
    assert_eq!(bandwidth["name"], "bandwidth");
    let vrate = bandwidth["vrate"].as_f64().expect("vrate");
    let swept: Vec<f64> = r["points"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["vrate"].as_f64())
        .collect();
    let (lo, hi) = swept
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
    assert!(
        lo <= vrate && vrate <= hi,
        "vrate {vrate} outside {swept:?}"
    );
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        stdout.contains("[qos.dev]") && stdout.contains("isolation solution"),
        "{stdout}"
    );
    assert!(out.join("report.md").exists() && out.join("tune.png").exists());
    // The isolation candidate was run again before it was named.
    let all = r["points"]
        .as_array()
        .into_iter()
        .chain(r["depths"].as_array())
        .flatten();
    let confirmed: Vec<_> = all.filter(|p| p["runs"].as_u64() > Some(1)).collect();
    assert!(!confirmed.is_empty(), "no point confirmed: {r}");
    let again = std::fs::read_dir(out.join("points"))
        .expect("points")
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().ends_with("-again1.json"));
    assert!(again, "no repeated run saved");
}

/// `--served`: solo, untuned and every point through `iopace serve` of the
/// config and fio's nbd engine; each point's vrate is held by the server.
#[test]
fn tune_served_measures_through_the_server_at_each_vrate() {
    let _alone = alone();
    common::require("fio", "fio");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("tune.toml");
    std::fs::write(&cfg, format!("[server]\nreactors = 1\n\n{CONFIG}")).expect("config");
    let out = dir.path().join("tune");
    let mut c = Command::new(BIN);
    c.args(["tune", "--quick", "--served", "-c"])
        .arg(&cfg)
        .args(["dev", "--out"])
        .arg(&out);
    let done = run(&mut c, Duration::from_secs(180));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).expect("result"))
            .expect("json");
    assert_eq!(r["path"], "served (nbd)");
    assert!(
        r["untuned"]["adversary"]["rate"].as_f64() > Some(0.0),
        "{r}"
    );
    let points = r["points"].as_array().expect("points");
    assert!(points.len() >= 4, "{r}");
    for p in points {
        let (vrate, held) = (p["vrate"].as_f64(), p["vrate_held"].as_f64());
        let (Some(vrate), Some(held)) = (vrate, held) else {
            panic!("a point without its held vrate: {p}");
        };
        assert!(
            (held / vrate - 1.0).abs() < 0.03,
            "vrate {vrate}% held at {held}%"
        );
        assert!(p["probe"]["p99_us"].as_f64() > Some(0.0), "{p}");
    }
    let iso = &r["solutions"][1];
    assert_eq!(iso["name"], "isolation");
    let target = iso["probe_target_us"].as_f64().expect("the probe's target");
    let solo = r["solo"]["p99_us"].as_f64().expect("solo p99");
    assert!((target / solo - 2.0).abs() < 1e-9, "{iso}");
    assert!(out.join("served/solo/served.toml").exists());
    let stdout = String::from_utf8_lossy(&done.stdout);
    // Caps were swept too, each served with its light_depth.
    let depths = r["depths"].as_array().expect("depths");
    assert!(!depths.is_empty(), "{r}");
    for p in depths {
        assert!(p["light_depth"].as_u64() > Some(0), "{p}");
        assert!(p["probe"]["p99_us"].as_f64() > Some(0.0), "{p}");
    }
    // The snippet holds vrate at the point (min = max, no latency target),
    // or caps the device at the cap point.
    let snippet = match iso["light_depth"].as_u64() {
        Some(n) => format!("[qos.dev]\nlight_depth = {n}\n"),
        None => {
            let v = iso["vrate"].as_f64().expect("vrate");
            format!("[qos.dev]\nmin = {v:.1}\nmax = {v:.1}\n")
        }
    };
    assert!(stdout.contains(&snippet), "{stdout}");
}

/// `--served` on a file image: every `iopace serve` it starts locks the
/// image, so tune must not hold it open itself (each served run failed
/// with "in use"). Solo, untuned and the first point are enough to show it.
#[test]
fn tune_served_on_a_file_image_serves_it() {
    let _alone = alone();
    common::require("fio", "fio");
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("disk.img");
    let cfg = dir.path().join("tune.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nreactors = 1\n\n[[bdev]]\nname = \"disk\"\nkind = \"file\"\npath = \"{}\"\n\
             size = \"16MiB\"\ndirect = \"off\"\n\n[[export]]\nname = \"disk\"\nbdev = \"disk\"\n\n\
             [cost.disk]\nrbps = 1e9\nrseqiops = 100000\nrrandiops = 50000\nwbps = 1e9\n\
             wseqiops = 100000\nwrandiops = 50000\n",
            img.display()
        ),
    )
    .expect("config");
    let out = dir.path().join("tune");
    // In a process group of its own, so the kill below takes the server
    // and fio it started too (killed alone, tune leaves them running).
    let mut child = Command::new(BIN)
        .args(["tune", "--quick", "--served", "-c"])
        .arg(&cfg)
        .args(["disk", "--out"])
        .arg(&out)
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn tune");
    let first = out.join("points").join("depth-032.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut exited = None;
    while !first.exists() && Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            exited = Some(status);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if exited.is_none() {
        // SAFETY: signals the process group the child leads.
        unsafe {
            libc::kill(-(child.id() as i32), libc::SIGKILL);
        }
    }
    let done = child.wait_with_output().expect("reap tune");
    assert!(
        first.exists(),
        "no point served ({:?}): {}",
        exited,
        String::from_utf8_lossy(&done.stderr)
    );
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&first).expect("point")).expect("json");
    assert!(p["probe"]["p99_us"].as_f64() > Some(0.0), "{p}");
    assert!(p["adversary"]["rate"].as_f64() > Some(0.0), "{p}");
}
