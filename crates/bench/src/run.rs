//! Executes a scenario: the hosts (fio servers, the wire), then every run
//! (target up, `fio --client` on every host, target stats sampled, target
//! down), saving each run's result so an interrupted bench can resume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::fio::{self, FioResult};
use crate::procs::{self, Proc};
use crate::result::RunResult;
use crate::sampler::{target_stats, Sampler, Snapshot};
use crate::scenario::{
    fair_shares, parse_tc_rate, port_gbps_at, port_rate_at, port_shaped, HostKind, HostWire,
    Loaded, Point, RunId, Scenario, TargetSpec, Transport, Workload,
};
use crate::target_proc::{self, Listen, Running, StartCtx};
use crate::wire::{self, Wire};

pub struct Options {
    pub quick: bool,
    /// Run on these real hosts (their `fio --server` addresses) instead of
    /// the scenario's, reaching the target at `target_address`.
    pub remote: Option<Remote>,
    pub out: PathBuf,
    pub resume: bool,
    pub iopace_bin: PathBuf,
    /// `--var NAME=VALUE` overrides of the scenarios' `[vars]`.
    pub vars: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Remote {
    pub hosts: Vec<String>,
    pub target_address: String,
}

/// The initiator side, set up once per scenario.
struct Hosts {
    kind: HostKind,
    /// `fio --client` addresses, one per host.
    clients: Vec<String>,
    wire: Option<Wire>,
    _servers: Vec<Proc>,
}

impl Hosts {
    fn up(s: &Scenario, dir: &Path) -> Result<Hosts, String> {
        let h = &s.hosts;
        match h.kind {
            HostKind::Remote => Ok(Hosts {
                kind: h.kind,
                clients: h
                    .addresses
                    .iter()
                    .map(|a| fio_client_addr(a, h.fio_port))
                    .collect(),
                wire: None,
                _servers: Vec::new(),
            }),
            HostKind::Local => {
                let mut servers = Vec::new();
                let mut clients = Vec::new();
                for i in 1..=h.count {
                    let port = free_port()?;
                    let mut cmd = Command::new("fio");
                    cmd.arg(format!("--server=ip:127.0.0.1,{port}"));
                    let log = dir.join(format!("fio-server-h{i}.log"));
                    let mut p = Proc::spawn(&format!("fio server h{i}"), cmd, &log)?;
                    let addr = format!("127.0.0.1:{port}");
                    p.wait_ready("listening", || procs::tcp_accepts(&addr))?;
                    servers.push(p);
                    clients.push(fio_client_addr("127.0.0.1", port));
                }
                Ok(Hosts {
                    kind: h.kind,
                    clients,
                    wire: None,
                    _servers: servers,
                })
            }
            HostKind::Netns => {
                let wire = Wire::up(h.count, port_shaped(s))?;
                let mut servers = Vec::new();
                let mut clients = Vec::new();
                for i in 1..=h.count {
                    let addr = wire::host_addr(i);
                    let mut cmd = Command::new("ip");
                    cmd.args(["netns", "exec", &wire::ns(i), "fio"])
                        .arg(format!("--server=ip:{addr},{}", h.fio_port));
                    let log = dir.join(format!("fio-server-h{i}.log"));
                    let mut p = Proc::spawn(&format!("fio server h{i}"), cmd, &log)?;
                    let a = format!("{addr}:{}", h.fio_port);
                    p.wait_ready("listening", || procs::tcp_accepts(&a))?;
                    servers.push(p);
                    clients.push(fio_client_addr(&addr, h.fio_port));
                }
                Ok(Hosts {
                    kind: h.kind,
                    clients,
                    wire: Some(wire),
                    _servers: servers,
                })
            }
        }
    }

    /// Bytes through each host's link, or through loopback for all of them.
    fn counters(&self) -> Vec<u64> {
        match (&self.wire, self.kind) {
            (Some(w), _) => w.counters(),
            (None, HostKind::Local) => vec![wire::link_bytes("lo")],
            _ => Vec::new(),
        }
    }
}

fn fio_client_addr(addr: &str, port: u16) -> String {
    format!("ip:{addr},{port}")
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Checks the tools a scenario needs, naming the packages to install.
pub fn preflight(s: &Scenario) -> Result<(), String> {
    procs::require("fio", "fio")?;
    if s.hosts.kind == HostKind::Netns {
        wire::preflight()?;
    }
    for t in &s.target {
        target_proc::preflight(t)?;
    }
    Ok(())
}

/// Runs a scenario's runs not already saved; returns all its results.
pub fn run_scenario(
    loaded: &Loaded,
    opts: &Options,
    bar: &ProgressBar,
) -> Result<Vec<RunResult>, String> {
    let s = &loaded.scenario;
    let points = s.points();
    let runs = s.runs(&points);
    let runs_dir = opts.out.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(|e| format!("{}: {e}", runs_dir.display()))?;
    let mut results = Vec::new();
    let mut todo = Vec::new();
    for r in runs {
        let path = runs_dir.join(format!("{}.json", r.key(s)));
        match (opts.resume, load_run(&path)) {
            (true, Some(done)) => {
                bar.inc(1);
                results.push(done);
            }
            _ => todo.push(r),
        }
    }
    if todo.is_empty() {
        return Ok(results);
    }
    preflight(s)?;
    // Sockets need short paths; logs and configs of the runs go here too.
    let scratch = tempfile::Builder::new()
        .prefix("iopace-bench-")
        .tempdir()
        .map_err(|e| format!("scratch dir: {e}"))?;
    let logs = opts.out.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let hosts = Hosts::up(s, &logs)?;
    let mut shaped: Option<(Vec<HostWire>, Option<String>)> = None;
    let scenario_dir = loaded
        .path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    for r in todo {
        procs::check_interrupt()?;
        let key = r.key(s);
        bar.set_message(key.clone());
        let point = &points[r.point];
        if let Some(w) = &hosts.wire {
            let want = (s.wire_at(point), port_rate_at(s, point));
            if shaped.as_ref() != Some(&want) {
                w.shape(&want.0, want.1.as_deref())?;
                shaped = Some(want);
            }
        }
        let run_dir = scratch.path().join(&key);
        std::fs::create_dir_all(&run_dir).map_err(|e| e.to_string())?;
        let result = one_run(s, &r, point, &hosts, &scenario_dir, &run_dir, opts);
        keep_logs(&run_dir, &logs, &key);
        let result = result.map_err(|e| format!("{key}: {e} (logs: {})", logs.display()))?;
        let path = runs_dir.join(format!("{key}.json"));
        let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        let swept: Vec<String> = s.sweep.keys().cloned().collect();
        say(bar, &crate::table::host_table(&result, &swept));
        bar.inc(1);
        results.push(result);
    }
    Ok(results)
}

/// Keeps a run's logs, configs and fio output with the results (also when
/// it failed; sockets stay behind), then removes the run's directory: files
/// a run created (a file bdev's image can be GiBs) go now.
fn keep_logs(run_dir: &Path, logs: &Path, key: &str) {
    for entry in std::fs::read_dir(run_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if [".log", ".toml", ".fio", ".json"]
            .iter()
            .any(|x| name.ends_with(x))
        {
            let _ = std::fs::copy(entry.path(), logs.join(format!("{key}-{name}")));
        }
    }
    let _ = std::fs::remove_dir_all(run_dir);
}

/// fio's nbd engine reports each connection on stdout before the JSON.
fn fio_connected(out: &Path) -> bool {
    std::fs::read_to_string(out).is_ok_and(|t| t.contains("connected to NBD server"))
}

fn load_run(path: &Path) -> Option<RunResult> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn one_run(
    s: &Scenario,
    r: &RunId,
    point: &Point,
    hosts: &Hosts,
    scenario_dir: &Path,
    run_dir: &Path,
    opts: &Options,
) -> Result<RunResult, String> {
    let spec = &s.target[r.target];
    let work = s.workload_at(point);
    let works = s.host_workloads(point);
    let n_hosts = hosts.clients.len();
    let listen = listen_for(s, run_dir)?;
    let vars = run_vars(spec, point, run_dir)?;
    let ctx = StartCtx {
        iopace_bin: &opts.iopace_bin,
        scenario_dir,
        run_dir,
        listen: &listen,
        vars: &vars,
        exports: &work.exports,
        port_gbps: port_gbps_at(s, spec, point),
    };
    let mut target = target_proc::start(spec, &ctx)?;
    // Hosts with an export of their own run fewer jobs each.
    let iodepth = works.first().unwrap_or(&work).job_iodepth(n_hosts);
    let fio_run = FioRun::start(hosts, &works, iodepth, &listen, run_dir)?;
    let watched = fio_run.watch(hosts, &mut target, &work, &listen);
    target.proc.stop();
    let watched = watched?;
    let mut result = fio::reduce(&fio::json_of(&watched.output)?)?;
    let start = watched.window.unwrap_or_else(|| watched.end.clone());
    let end = watched.end;
    let secs = end.at.duration_since(start.at).as_secs_f64().max(1e-3);
    wire_rates(s, point, hosts, &mut result, &start, &end, secs);
    let stats = target_stats(watched.sampler, &start, &end, secs, result.total.ios);
    Ok(RunResult {
        test: s.test.name.clone(),
        key: r.key(s),
        point: point.index,
        vars: point.vars.clone(),
        target: spec.name.clone(),
        rep: r.rep,
        total_qd: works.iter().map(|w| w.host_qd(n_hosts)).sum(),
        job_iodepth: iodepth,
        fio: result,
        stats,
        window_s: secs,
    })
}

/// Where the target listens, as the hosts reach it.
fn listen_for(s: &Scenario, run_dir: &Path) -> Result<Listen, String> {
    Ok(match (s.hosts.kind, s.hosts.transport) {
        (HostKind::Local, Transport::Unix) => Listen::Unix(run_dir.join("nbd.sock")),
        (HostKind::Local, Transport::Tcp) => Listen::Tcp {
            addr: "127.0.0.1".into(),
            port: free_port()?,
        },
        (HostKind::Netns, _) => Listen::Tcp {
            addr: wire::TARGET_ADDR.into(),
            port: s.hosts.nbd_port,
        },
        (HostKind::Remote, _) => Listen::Tcp {
            addr: s.hosts.target_address.clone().unwrap_or_default(),
            port: s.hosts.nbd_port,
        },
    })
}

/// The point's variables plus `scratch`, and `file` once it is created.
fn run_vars(
    spec: &TargetSpec,
    point: &Point,
    run_dir: &Path,
) -> Result<BTreeMap<String, String>, String> {
    let mut vars = point.vars.clone();
    vars.insert("scratch".into(), run_dir.display().to_string());
    if let Some(size) = spec
        .file_size
        .as_deref()
        .and_then(crate::scenario::parse_size)
    {
        let file = run_dir.join(format!("{}.img", spec.name));
        let f = std::fs::File::create(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        f.set_len(size)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        vars.insert("file".into(), file.display().to_string());
    }
    Ok(vars)
}

/// fio driving every host, and where its output goes.
struct FioRun {
    proc: std::process::Child,
    out_path: PathBuf,
    err_path: PathBuf,
}

/// What watching one fio run gave.
struct Watched {
    output: String,
    window: Option<Snapshot>,
    end: Snapshot,
    sampler: Sampler,
}

impl FioRun {
    /// One job file per host, each naming the target's URI as the hosts see it.
    fn start(
        hosts: &Hosts,
        works: &[Workload],
        iodepth: u32,
        listen: &Listen,
        run_dir: &Path,
    ) -> Result<FioRun, String> {
        let mut cmd = Command::new("fio");
        cmd.arg("--output-format=json");
        for (i, (client, work)) in hosts.clients.iter().zip(works).enumerate() {
            let host = format!("h{}", i + 1);
            let job = fio::job_file(&host, work, iodepth, &|e| listen.uri(e));
            let path = run_dir.join(format!("{host}.fio"));
            std::fs::write(&path, job).map_err(|e| e.to_string())?;
            cmd.arg(format!("--client={client}")).arg(&path);
        }
        let out_path = run_dir.join("fio.json");
        let stdout = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        let err_path = run_dir.join("fio-client.log");
        let stderr = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
        let proc = cmd
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start fio: {e}"))?;
        Ok(FioRun {
            proc,
            out_path,
            err_path,
        })
    }

    /// Waits for fio, taking snapshots at the measured window's ends and
    /// sampling the target in between.
    fn watch(
        mut self,
        hosts: &Hosts,
        target: &mut Running,
        work: &Workload,
        listen: &Listen,
    ) -> Result<Watched, String> {
        let started = Instant::now();
        let ramp = Duration::from_secs(u64::from(work.ramp));
        let runtime = Duration::from_secs(u64::from(work.runtime));
        let deadline = started + ramp + runtime + Duration::from_secs(60);
        // fio's clock starts when its jobs connect, which takes a while over
        // `--client`; the window is timed from then, ending a little early so
        // it lies inside fio's measured time.
        let mut io_began: Option<Instant> = None;
        let mut window: Option<Snapshot> = None;
        let mut end: Option<Snapshot> = None;
        let mut sampler = Sampler::default();
        let status = loop {
            if let Some(st) = self.proc.try_wait().map_err(|e| e.to_string())? {
                break st;
            }
            let now = Instant::now();
            if procs::interrupted() || now > deadline || target.proc.check_alive().is_err() {
                let _ = self.proc.kill();
                let _ = self.proc.wait();
                target.proc.check_alive()?;
                procs::check_interrupt()?;
                return Err(format!("fio did not finish by {:?}", deadline - started));
            }
            if io_began.is_none() && fio_connected(&self.out_path) {
                io_began = Some(now);
            }
            let Some(began) = io_began else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let elapsed = now - began;
            if elapsed >= ramp && window.is_none() {
                window = Some(Snapshot::take(hosts.counters(), target));
            }
            if window.is_some() && end.is_none() {
                if elapsed + Duration::from_millis(300) >= ramp + runtime {
                    end = Some(Snapshot::take(hosts.counters(), target));
                } else {
                    sampler.sample(target.rpc.as_ref(), listen);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let end = end.unwrap_or_else(|| Snapshot::take(hosts.counters(), target));
        if !status.success() {
            return Err(format!(
                "fio failed ({status}): {}",
                procs::log_tail(&self.err_path)
            ));
        }
        Ok(Watched {
            output: std::fs::read_to_string(&self.out_path).unwrap_or_default(),
            window,
            end,
            sampler,
        })
    }
}

/// Each host's wire bandwidth and link rate from the interface counters.
fn wire_rates(
    s: &Scenario,
    point: &Point,
    hosts: &Hosts,
    result: &mut FioResult,
    start: &Snapshot,
    end: &Snapshot,
    secs: f64,
) {
    let wire: Vec<f64> = end
        .link
        .iter()
        .zip(&start.link)
        .map(|(b, a)| b.saturating_sub(*a) as f64 * 8.0 / secs / 1e9)
        .collect();
    if hosts.wire.is_some() && wire.len() == result.hosts.len() {
        let links: Vec<Option<f64>> = s.wire_at(point).iter().map(HostWire::rate_gbps).collect();
        let port = port_rate_at(s, point).as_deref().and_then(parse_tc_rate);
        let shares = fair_shares(&links, port.map(|bps| bps / 1e9));
        for (((h, w), link), share) in result.hosts.iter_mut().zip(&wire).zip(&links).zip(shares) {
            h.wire_gbps = Some(*w);
            h.link_gbps = *link;
            h.share_gbps = port.and(share);
        }
        result.total = fio::total_of(&result.hosts);
    } else if s.hosts.transport == Transport::Tcp && wire.len() == 1 {
        // Loopback is shared by all hosts: only the total is known, and it
        // counts both directions of every packet once.
        result.total.wire_gbps = Some(wire[0] / 2.0);
    }
}

/// Prints above the progress bar, or plainly when there is no terminal
/// (indicatif drops `println` on a hidden bar).
pub fn say(bar: &ProgressBar, msg: &str) {
    if bar.is_hidden() {
        println!("{msg}");
    } else {
        bar.println(msg);
    }
}

/// A progress bar over all runs, with an ETA.
pub fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} runs, ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}
