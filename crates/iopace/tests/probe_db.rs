//! The results database: `probe db add` keys runs by model and firmware,
//! `merge` reports their spread, and `serve` takes a bdev's cost model from
//! the database when its config has no `[cost.NAME]`, saying which entry.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run, BIN};

const CONFIG: &str = "[[bdev]]\nname = \"base\"\nkind = \"null\"\nsize = \"1GiB\"\n\n\
[[bdev]]\nname = \"dev\"\nkind = \"model\"\nbase = \"base\"\n\
cost = { rbps = 400e6, rseqiops = 20000, rrandiops = 10000, wbps = 200e6, wseqiops = 10000, wrandiops = 5000 }\n\
latency_us = 100\n\n[[export]]\nname = \"dev\"\nbdev = \"dev\"\n";

#[test]
fn db_merges_runs_and_serve_uses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("model.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let out = dir.path().join("probe");
    run(
        Command::new(BIN)
            .args(["probe", "--quick", "--max-qd", "2", "--threads", "1", "-c"])
            .arg(&cfg)
            .arg("dev")
            .arg("--out")
            .arg(&out),
        Duration::from_secs(120),
    );
    let db = dir.path().join("db");
    let result = out.join("result.json");
    for _ in 0..2 {
        run(
            Command::new(BIN)
                .args(["probe", "db", "add"])
                .arg(&db)
                .arg(&result),
            Duration::from_secs(10),
        );
    }
    // The second run saw 20% more read bandwidth.
    let key = db.join("iopace_model");
    let fw = std::fs::read_dir(&key)
        .expect("model dir")
        .next()
        .expect("firmware dir")
        .expect("entry")
        .path();
    let mut runs: Vec<_> = std::fs::read_dir(&fw)
        .expect("runs")
        .map(|e| e.expect("entry").path())
        .collect();
    runs.sort();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let mut second: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&runs[1]).expect("run")).expect("json");
    let rbps = second["cost"]["rbps"].as_f64().expect("rbps");
    second["cost"]["rbps"] = serde_json::json!(rbps * 1.2);
    std::fs::write(&runs[1], second.to_string()).expect("rewrite");

    let merged = run(
        Command::new(BIN).args(["probe", "db", "merge"]).arg(&db),
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&merged.stdout);
    assert!(
        text.contains("2 runs merged") && text.contains("rbps 18.2%"),
        "{text}"
    );
    let shown = run(
        Command::new(BIN).args(["probe", "db", "show"]).arg(&db),
        Duration::from_secs(10),
    );
    assert!(String::from_utf8_lossy(&shown.stdout).contains("iopace model"));
    // As iocost-benchmarks' hwdb, and back into another database.
    let exported = run(
        Command::new(BIN).args(["probe", "db", "export"]).arg(&db),
        Duration::from_secs(10),
    );
    let hwdb = String::from_utf8_lossy(&exported.stdout).into_owned();
    assert!(
        hwdb.contains("block:*:name:iopace model:fwver:")
            && hwdb.contains(" IOCOST_MODEL_BANDWIDTH=rbps="),
        "{hwdb}"
    );
    let file = dir.path().join("export.hwdb");
    std::fs::write(&file, &hwdb).expect("hwdb");
    let other = dir.path().join("other-db");
    run(
        Command::new(BIN)
            .args(["probe", "db", "import"])
            .arg(&other)
            .arg(&file),
        Duration::from_secs(10),
    );
    let again = run(
        Command::new(BIN)
            .args(["probe", "db", "export"])
            .arg(&other),
        Duration::from_secs(10),
    );
    assert_eq!(String::from_utf8_lossy(&again.stdout), hwdb);

    // Served without [cost.dev]: the merged entry, at 1.1x the first run's rbps.
    let served = dir.path().join("serve.toml");
    let check_with = |db: &std::path::Path| {
        std::fs::write(
            &served,
            format!("cost_db = {:?}\n{CONFIG}", db.display().to_string()),
        )
        .expect("config");
        let check = run(
            Command::new(BIN)
                .args(["serve", "--check", "-c"])
                .arg(&served),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&check.stderr).into_owned()
    };
    let log = check_with(&db);
    assert!(
        log.contains("cost model from the database") && log.contains("merged.json"),
        "{log}"
    );

    let missing = dir.path().join("empty-db");
    std::fs::create_dir_all(&missing).expect("mkdir");
    assert!(check_with(&missing).contains("no cost model in the database"));
}

/// A `model` bdev served over NBD holds each IO for its service time plus
/// its latency: 1 ms + 10 us + 5 ms for a random 4 KiB read here, so no
/// QD 1 read may run faster than 166 a second (a bound the machine's load
/// can only keep: it only adds time).
#[test]
fn served_model_bdev_holds_each_io() {
    common::require("qemu-io", "qemu-utils");
    let body = "[[bdev]]\nname = \"base\"\nkind = \"null\"\nsize = \"1GiB\"\n\n\
        [[bdev]]\nname = \"dev\"\nkind = \"model\"\nbase = \"base\"\n\
        cost = { rbps = 400e6, rseqiops = 2000, rrandiops = 1000, wbps = 200e6, wseqiops = 1000, wrandiops = 500 }\n\
        latency_us = 5000\n\n[[export]]\nname = \"dev\"\nbdev = \"dev\"\n";
    let server = common::Server::start(body);
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for i in 0..10 {
        cmd.args(["-c", &format!("read {} 4k", (i * 3) << 20)]);
    }
    cmd.arg(server.unix_uri("dev"));
    let out = run(&mut cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    // qemu-io prints "4 KiB, 1 ops; 00.01 sec (... and 158.6742 ops/sec)".
    let rates: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split(" and ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(rates.len(), 10, "{text}");
    for r in rates {
        assert!(
            r < 1e6 / 6010.0,
            "a read ran at {r} ops/s: not held\n{text}"
        );
    }
    server.stop();
}
