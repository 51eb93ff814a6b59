//! `iopace bench` end to end: scenarios/quick.toml with `--quick` on real
//! network namespaces behind shaped veths, real fio hosts, the real target.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{require, BIN};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The netns tests share one bridge and its namespace names: one at a time.
static NETNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn quick_scenario_on_shaped_namespaces_writes_every_output() {
    require("fio", "fio");
    require("tc", "iproute2");
    assert!(
        is_root(),
        "the bench test needs root for network namespaces (CI runs as root)"
    );
    let _netns = NETNS.lock().unwrap_or_else(|e| e.into_inner());
    let out = tempfile::tempdir().expect("out dir");
    let run = Command::new(BIN)
        .args(["bench", "--quick", "--out"])
        .arg(out.path())
        .arg(repo().join("scenarios/quick.toml"))
        .output()
        .expect("run iopace bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed:\n{stdout}\n{stderr}");
    // The sweep tables on the console.
    assert!(stdout.contains(" Host | kIOPS |"), "{stdout}");
    assert!(stdout.contains("| Total |"), "{stdout}");
    assert!(stdout.contains("Bufs in-flight"), "{stdout}");
    assert!(stdout.contains("report.md"), "{stdout}");
    for f in [
        "report.md",
        "results.json",
        "results.csv",
        "quick-bw.png",
        "quick-lat-cdf.png",
    ] {
        let len = std::fs::metadata(out.path().join(f)).map_or(0, |m| m.len());
        assert!(len > 200, "{f} missing or empty ({len} bytes)");
    }
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("results.json")).expect("results.json"),
    )
    .expect("valid JSON");
    let runs = results["tests"][0]["runs"].as_array().expect("runs");
    // mode none/auto x qd 8/256.
    assert_eq!(runs.len(), 4);
    for r in runs {
        let hosts = r["fio"]["hosts"].as_array().expect("hosts");
        assert_eq!(hosts.len(), 2, "two namespaces, two host rows");
        let total = &r["fio"]["total"];
        for field in ["kiops", "bw_gbps", "wire_gbps"] {
            let sum: f64 = hosts.iter().map(|h| h[field].as_f64().expect(field)).sum();
            let t = total[field].as_f64().expect(field);
            assert!(close(sum, t), "{field}: hosts add to {sum}, total says {t}");
            assert!(t > 0.0, "{field} is zero");
        }
        let ios: u64 = hosts.iter().map(|h| h["ios"].as_u64().expect("ios")).sum();
        assert_eq!(ios, total["ios"].as_u64().expect("ios"));
        // Each host's wire is shaped to 1 Gbit/s: what it carried cannot exceed that much.
        for h in hosts {
            let w = h["wire_gbps"].as_f64().expect("wire");
            assert!(w > 0.05 && w < 1.1, "host wire {w} Gb/s on a 1 Gbit/s link");
        }
        assert!(
            r["stats"]["bufs_avg_mib"].as_f64().is_some(),
            "iopace bufs sampled"
        );
        assert!(r["stats"]["samples"].as_u64().unwrap_or(0) > 0);
    }
    let csv = std::fs::read_to_string(out.path().join("results.csv")).expect("csv");
    // Header, and per run two hosts and a total.
    assert_eq!(csv.lines().count(), 1 + 4 * 3, "{csv}");
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report");
    assert!(
        report.contains("| [quick](#quick) |"),
        "test index: {report}"
    );
    assert!(report.contains("![quick](quick-bw.png)"));

    // --resume finds every run saved and runs nothing again.
    let saved = out.path().join("runs");
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .expect("mtime")
    };
    let before: Vec<_> = std::fs::read_dir(&saved)
        .expect("runs dir")
        .flatten()
        .map(|e| (e.path(), stamp(&e.path())))
        .collect();
    assert_eq!(before.len(), 4);
    let again = Command::new(BIN)
        .args(["bench", "--quick", "--resume", "--out"])
        .arg(out.path())
        .arg(repo().join("scenarios/quick.toml"))
        .output()
        .expect("resume");
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    for (p, t) in before {
        assert_eq!(stamp(&p), t, "{} was run again", p.display());
    }
    // Every namespace is gone afterwards.
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains("iopace-h"),
        "namespaces left behind"
    );
}

#[test]
fn scenario_errors_name_file_line_field_and_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[test]\nname = \"x\"\ntitle = \"t\"\n[[target]]\nname = \"a\"\nkind = \"iopace\"\n\
         [workload]\nbs = \"4k\"\n[hosts]\ncount = 0\n",
    )
    .expect("write");
    let run = Command::new(BIN)
        .args(["bench", "--out"])
        .arg(dir.path().join("out"))
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains(&format!("{}:10: field `hosts.count`", path.display())),
        "{err}"
    );
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[test]\nname = \"x\"\ntitle = \"t\"\nqd = 3\n").expect("write");
    let run = Command::new(BIN)
        .args(["bench"])
        .arg(&typo)
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("typo.toml:4: field `qd`"), "{err}");
}

/// `--var` names a `[vars]` default to replace: a misspelt or empty name is
/// a usage error (exit 2, nothing run), not a run that silently keeps the
/// default.
#[test]
fn var_that_names_no_scenario_variable_exits_2_before_running() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("vars.toml");
    std::fs::write(
        &path,
        "[test]\nname = \"v\"\ntitle = \"t\"\n[vars]\nbase_bin = \"/nonexistent/iopace\"\n\
         [[target]]\nname = \"a\"\nkind = \"iopace\"\nbin = \"{{base_bin}}\"\n\
         [hosts]\nkind = \"local\"\ncount = 1\n[workload]\nbs = \"4k\"\nqd = 1\nruntime = 1\n",
    )
    .expect("write");
    let out = dir.path().join("out");
    for (var, named) in [("base_bni=/bin/true", "`base_bni`"), ("=x", "``")] {
        let run = Command::new(BIN)
            .args(["bench", "--var", var, "--out"])
            .arg(&out)
            .arg(&path)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "--var {var}: {err}");
        assert!(
            err.contains(named) && err.contains("base_bin"),
            "names the variable and the scenario's: {err}"
        );
        assert!(!out.exists(), "--var {var}: ran before failing");
    }
}

/// A shaped target port whose capacity the target is told: the config
/// the harness writes gives the listener its `gbps`, the target counts its
/// bytes through that port, and each host's share is its part of the port.
#[test]
fn a_target_told_its_shaped_port_counts_its_load_there() {
    require("fio", "fio");
    require("tc", "iproute2");
    assert!(
        is_root(),
        "the bench test needs root for network namespaces"
    );
    let _netns = NETNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let scenario = dir.path().join("ports.toml");
    std::fs::write(
        &scenario,
        "[test]\nname = \"ports\"\ntitle = \"a shaped port\"\n\
         [[target]]\nname = \"known\"\nkind = \"iopace\"\n\
         args = [\"--pacing\", \"auto\", \"--reactors\", \"1\"]\nport_gbps = \"wire\"\n\
         [hosts]\nkind = \"netns\"\ncount = 2\nrate = [\"1gbit\", \"250mbit\"]\n\
         port_rate = \"500mbit\"\n\
         [workload]\nrw = \"randread\"\nbs = \"128k\"\nqd = 16\nruntime = 2\nramp = 1\n",
    )
    .expect("scenario");
    let out = dir.path().join("out");
    let run = Command::new(BIN)
        .args(["bench", "--out"])
        .arg(&out)
        .arg(&scenario)
        .output()
        .expect("run iopace bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("Share of port, Gb/s"), "{stdout}");
    let config = std::fs::read_to_string(out.join("logs/ports-p000-known-r0-known.toml"))
        .expect("the config the harness wrote");
    assert!(config.contains("gbps = 0.5"), "{config}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("json"))
            .expect("valid JSON");
    let r = &results["tests"][0]["runs"][0];
    let port = &r["stats"]["ports"]["bench"];
    assert_eq!(port["gbps"].as_f64(), Some(0.5), "{r}");
    // The port carries the reads, within its rate (tbf counts whole frames).
    let sent = port["sent_gbps"].as_f64().expect("sent");
    assert!(
        sent > 0.1 && sent < 0.5,
        "{sent} Gb/s through a 500 Mbit/s port"
    );
    let shares: Vec<f64> = r["fio"]["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h["share_gbps"].as_f64().expect("share"))
        .collect();
    assert_eq!(shares, [0.25, 0.25], "max-min: each host half the port");
}
