//! tune's points measured through the path `iopace bench` measures: `iopace
//! serve` of the device (the user's config: its `[server]` settings, bdevs
//! and pacing mode) with two exports in two tenants of equal weight,
//! `adversary` and `probe`, read by fio's nbd engine over a Unix socket.
//! The server's own QoS budget holds vrate at the point's value, so a point
//! measures the config a solution applies: the server's CPU, its reactor's
//! queueing and the client's latency included. In process (the driver) the
//! QD 1 probe alone had a p99 of 122 us on this machine's disk, over NBD
//! 222-260 us, so a target from the first was missed by the probe alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bench::procs::{self, Proc};
use pace::pacer::CostModel;
use serde_json::Value;

use crate::driver::JobStats;

/// IOs the adversary keeps in flight: enough to saturate when unthrottled.
pub const ADVERSARY_QD: u32 = 64;

/// The export (and tenant) names of the two jobs.
pub const ADVERSARY: &str = "adversary";
pub const PROBE: &str = "probe";

/// How to serve the device and how long each run measures.
#[derive(Debug, Clone)]
pub struct Served {
    /// The `iopace` binary that serves.
    pub bin: PathBuf,
    /// The user's config, parsed: its `[server]`, bdevs and `[pacing]` stay.
    pub base: toml::Table,
    pub bdev: String,
    /// Bytes of the export the jobs read.
    pub size: u64,
    /// Scratch space: configs, sockets, logs, fio's output.
    pub dir: PathBuf,
    pub runtime_s: u32,
    pub ramp_s: u32,
    pub adversary_qd: u32,
}

/// What one served run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Outcome {
    pub adversary: Option<JobStats>,
    pub probe: JobStats,
    /// The vrate (percent) the server reported at the end of the run.
    pub vrate_held: Option<f64>,
    /// The server's CPU over the run (ramp included) per IO, us.
    pub cpu_us_per_io: Option<f64>,
}

/// The `[qos.BDEV]` that holds vrate at `vrate` percent: `min` = `max` =
/// `vrate`, no latency target (vrate starts there and stays).
pub fn pinned_qos(vrate: f64) -> toml::Table {
    let mut t = toml::Table::new();
    t.insert("min".into(), vrate.into());
    t.insert("max".into(), vrate.into());
    t
}

/// The `[qos.BDEV]` that holds other tenants' IOs at the device to `n`
/// beside a light one (`light_depth`), with no budget.
pub fn depth_qos(n: u32) -> toml::Table {
    let mut t = toml::Table::new();
    t.insert("light_depth".into(), i64::from(n).into());
    t
}

/// The config one run serves: `base` without its exports, listeners'
/// extras (metrics) and latency targets; the two exports of `bdev` in two
/// tenants; `cost` as `[cost.BDEV]`; `qos` (if any) as `[qos.BDEV]`.
pub fn served_config(
    base: &toml::Table,
    bdev: &str,
    cost: CostModel,
    qos: Option<toml::Table>,
) -> Result<String, String> {
    let mut c = base.clone();
    if let Some(server) = c.get_mut("server").and_then(toml::Value::as_table_mut) {
        server.remove("metrics");
    }
    let export = |name: &str| {
        let mut e = toml::Table::new();
        e.insert("name".into(), name.into());
        e.insert("bdev".into(), bdev.into());
        toml::Value::Table(e)
    };
    c.insert(
        "export".into(),
        vec![export(ADVERSARY), export(PROBE)].into(),
    );
    let tenant = |name: &str| {
        let mut t = toml::Table::new();
        t.insert("name".into(), name.into());
        t.insert("weight".into(), 1.0.into());
        t.insert("exports".into(), vec![toml::Value::from(name)].into());
        toml::Value::Table(t)
    };
    let pacing = c
        .entry("pacing")
        .or_insert_with(|| toml::Table::new().into())
        .as_table_mut()
        .ok_or("[pacing] is not a table")?;
    pacing.insert(
        "tenants".into(),
        vec![tenant(ADVERSARY), tenant(PROBE)].into(),
    );
    let mut costs = toml::Table::new();
    costs.insert(
        bdev.into(),
        toml::Value::try_from(cost).map_err(|e| e.to_string())?,
    );
    c.insert("cost".into(), costs.into());
    c.remove("qos");
    if let Some(q) = qos {
        let mut t = toml::Table::new();
        t.insert(bdev.into(), q.into());
        c.insert("qos".into(), t.into());
    }
    toml::to_string(&c).map_err(|e| e.to_string())
}

impl Served {
    /// Serves `config`'s bdev `t` with the iopace binary running now;
    /// each of the sweep's runs (solo, untuned and up to `points`) gets its
    /// share of `budget` (at most 30 s measured; quick: 1 s).
    pub fn for_tune(
        config: &Path,
        t: &crate::Target,
        dir: &Path,
        budget: Duration,
        points: u32,
        quick: bool,
    ) -> Result<Served, crate::ProbeError> {
        use crate::ProbeError::{Run, Usage};
        procs::require("fio", "fio").map_err(Usage)?;
        let text = std::fs::read_to_string(config)
            .map_err(|e| Usage(format!("{}: {e}", config.display())))?;
        let base: toml::Table =
            toml::from_str(&text).map_err(|e| Usage(format!("{}: {e}", config.display())))?;
        let bin = std::env::current_exe().map_err(|e| Run(format!("the iopace binary: {e}")))?;
        let ramp_s = if quick { 1 } else { 2 };
        let per_run = budget.as_secs() / u64::from(points + 2);
        let runtime_s = if quick {
            1
        } else {
            per_run.saturating_sub(u64::from(ramp_s) + 1).clamp(1, 30) as u32
        };
        Ok(Served {
            bin,
            base,
            bdev: t.name.clone(),
            size: t.bdev.size(),
            dir: dir.to_path_buf(),
            runtime_s,
            ramp_s,
            adversary_qd: ADVERSARY_QD,
        })
    }

    /// Serves with `qos` and reads the probe export at QD 1, beside the
    /// adversary at its QD if `adversary`; `name` names the run's files.
    pub fn run(
        &self,
        name: &str,
        cost: CostModel,
        qos: Option<toml::Table>,
        adversary: bool,
    ) -> Result<Outcome, String> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = dir.join("served.toml");
        std::fs::write(&config, served_config(&self.base, &self.bdev, cost, qos)?)
            .map_err(|e| format!("{}: {e}", config.display()))?;
        let (sock, rpc) = (dir.join("nbd.sock"), dir.join("admin.sock"));
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve").arg("--config").arg(&config);
        cmd.args(["--tcp", "none", "--unix"]).arg(&sock);
        cmd.arg("--rpc").arg(&rpc);
        let mut server = Proc::spawn("iopace serve", cmd, &dir.join("serve.log"))?;
        server.wait_ready("listening", || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        })?;
        server.wait_ready("admin socket", || {
            std::os::unix::net::UnixStream::connect(&rpc).is_ok()
        })?;
        let outcome = self.measure(&dir, &sock, &rpc, &mut server, adversary);
        server.stop();
        outcome
    }

    fn measure(
        &self,
        dir: &Path,
        sock: &Path,
        rpc: &Path,
        server: &mut Proc,
        adversary: bool,
    ) -> Result<Outcome, String> {
        let exports: Vec<&str> = if adversary {
            vec![ADVERSARY, PROBE]
        } else {
            vec![PROBE]
        };
        let job = dir.join("job.fio");
        std::fs::write(&job, self.job_file(&exports, sock))
            .map_err(|e| format!("{}: {e}", job.display()))?;
        let cpu0 = procs::cpu_seconds(server.pid());
        let t0 = Instant::now();
        let out = Command::new("fio")
            .arg("--output-format=json")
            .arg(&job)
            .output()
            .map_err(|e| format!("cannot run fio: {e}"))?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = procs::cpu_seconds(server.pid())
            .zip(cpu0)
            .map(|(b, a)| b - a);
        let text = String::from_utf8_lossy(&out.stdout);
        std::fs::write(dir.join("fio.json"), text.as_bytes()).map_err(|e| e.to_string())?;
        server.check_alive()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("fio failed ({}): {}", out.status, err.trim()));
        }
        let jobs = job_stats(&bench::fio::json_of(&text)?);
        let probe = *jobs.get(PROBE).ok_or("fio's JSON has no probe job")?;
        let adversary = jobs.get(ADVERSARY).copied();
        let iops = probe.rate + adversary.map_or(0.0, |a| a.rate);
        Ok(Outcome {
            adversary,
            probe,
            vrate_held: held_vrate(&admin::call(rpc, "get_stats", Value::Null)?),
            cpu_us_per_io: cpu.filter(|_| iops > 0.0).map(|c| c / secs / iops * 1e6),
        })
    }

    fn job_file(&self, exports: &[&str], sock: &Path) -> String {
        let w = bench::scenario::Workload {
            rw: "randread".into(),
            bs: Some("4k".into()),
            bssplit: None,
            qd: None,
            iodepth: Some(self.adversary_qd),
            numjobs: 1,
            exports: exports.iter().map(|e| e.to_string()).collect(),
            runtime: self.runtime_s,
            ramp: self.ramp_s,
            size: self.size.to_string(),
            fio: BTreeMap::new(),
            iodepth_of: BTreeMap::from([(PROBE.to_string(), 1)]),
        };
        bench::fio::job_file("tune", &w, self.adversary_qd, &|e| {
            format!("nbd+unix:///{e}?socket={}", sock.display())
        })
    }
}

/// Per export, its job's reads: IOPS, bandwidth, completion p50 and p99
/// (fio's `clat_ns`, the latency `iopace bench` reports). Jobs are named
/// `HOST.EXPORT.N`.
pub fn job_stats(doc: &Value) -> BTreeMap<String, JobStats> {
    let jobs = doc.get("jobs").and_then(Value::as_array);
    let num = |v: &Value, path: &[&str]| {
        path.iter()
            .try_fold(v, |cur, p| cur.get(p))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    };
    let mut out = BTreeMap::new();
    for j in jobs.into_iter().flatten() {
        let name = j.get("jobname").and_then(Value::as_str).unwrap_or("");
        let Some(export) = name.split('.').nth(1) else {
            continue;
        };
        let Some(r) = j.get("read") else { continue };
        let pct = |p: &str| num(r, &["clat_ns", "percentile", p]) / 1e3;
        out.insert(
            export.to_string(),
            JobStats {
                rate: num(r, &["iops"]),
                bytes_per_s: num(r, &["bw_bytes"]),
                p50_us: pct("50.000000"),
                p99_us: pct("99.000000"),
            },
        );
    }
    out
}

/// The vrate (percent) `get_stats` reports: of each reactor's devices the
/// one furthest from 100% (a device without targets reports 100%), the
/// lowest over reactors.
pub fn held_vrate(stats: &Value) -> Option<f64> {
    let reactors = stats.get("reactors")?.as_array()?;
    reactors
        .iter()
        .filter_map(|r| {
            let v = r.get("pacer")?.get("vrates")?.as_array()?;
            v.iter()
                .filter_map(Value::as_f64)
                .max_by(|a, b| (a - 1.0).abs().total_cmp(&(b - 1.0).abs()))
        })
        .reduce(f64::min)
        .map(|v| v * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> toml::Table {
        toml::from_str(
            "[server]\nreactors = 1\nmetrics = \"127.0.0.1:9109\"\n\
             [[bdev]]\nname = \"disk\"\nkind = \"null\"\nsize = \"1GiB\"\n\
             [[export]]\nname = \"old\"\nbdev = \"disk\"\n\
             [qos.disk]\nrpct = 95\nrlat_us = 5\n",
        )
        .expect("base config")
    }

    #[test]
    fn served_config_has_two_tenants_the_cost_and_the_pin() {
        let text = served_config(
            &base(),
            "disk",
            CostModel::default(),
            Some(pinned_qos(50.0)),
        )
        .expect("config");
        let loaded = config::Config::parse(&text, "served.toml").expect("valid config");
        let c = &loaded.config;
        let names: Vec<&str> = c.exports.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [ADVERSARY, PROBE]);
        assert_eq!(c.pacing.tenants.len(), 2);
        assert_eq!(c.server.reactors, 1);
        assert!(c.server.metrics.is_none(), "{text}");
        assert_eq!(c.cost.get("disk"), Some(&CostModel::default()));
        let q = c.qos.get("disk").expect("qos");
        assert_eq!((q.rpct, q.min, q.max), (0.0, 50.0, 50.0));
        // Untuned: no latency target, not even the user's.
        let text = served_config(&base(), "disk", CostModel::default(), None).expect("config");
        let loaded = config::Config::parse(&text, "served.toml").expect("valid config");
        assert!(loaded.config.qos.is_empty(), "{text}");
    }

    #[test]
    fn pins_hold_vrate_on_either_side_of_100() {
        let q: pace::pacer::QosConfig = toml::Value::Table(pinned_qos(160.0))
            .try_into()
            .expect("qos");
        assert_eq!((q.min, q.max), (160.0, 160.0));
        assert!(q.validate().is_ok());
        let q: pace::pacer::QosConfig = toml::Value::Table(pinned_qos(30.0))
            .try_into()
            .expect("qos");
        assert_eq!((q.min, q.max, q.rpct, q.wpct), (30.0, 30.0, 0.0, 0.0));
        assert!(q.validate().is_ok());
        let held = pace::pacer::DeviceQos::new(&[Some(q)], 0);
        assert!((held.vrate(0) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn fio_jobs_and_vrates_are_read() {
        let doc = serde_json::json!({"jobs": [
            {"jobname": "tune.adversary.0", "read": {"iops": 5000.0, "bw_bytes": 2.048e7,
                "clat_ns": {"percentile": {"50.000000": 90000, "99.000000": 900000}}}},
            {"jobname": "tune.probe.0", "read": {"iops": 4000.0, "bw_bytes": 1.6384e7,
                "clat_ns": {"percentile": {"50.000000": 60000, "99.000000": 250000}}}},
            {"jobname": "stray"}
        ]});
        let j = job_stats(&doc);
        assert_eq!(j.len(), 2);
        assert_eq!(j[PROBE].p99_us, 250.0);
        assert_eq!(j[ADVERSARY].rate, 5000.0);
        let stats = serde_json::json!({"reactors": [
            {"pacer": {"vrates": [1.0, 0.5]}}, {"pacer": {"vrates": [1.0, 0.52]}}
        ]});
        assert_eq!(held_vrate(&stats), Some(50.0));
        assert_eq!(held_vrate(&serde_json::json!({})), None);
    }
}
