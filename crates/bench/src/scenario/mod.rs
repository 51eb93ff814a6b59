//! Scenario files: targets, hosts, workload and sweeps, expanded into runs.
//!
//! A sweep variable is any name. `qd`, `bs`, `rw`, `numjobs`, `iodepth`,
//! `jobs` (exports and their depths, see [`jobs`]), `rate` and `delay`
//! also change the workload or the wire; every variable
//! (swept or from `[vars]`) fills `{{name}}` placeholders in target configs
//! and arguments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tomlfile::{from_toml, locate, read_text, ConfigError};

mod host_wire;
pub mod jobs;
mod port;
mod validate;

pub use host_wire::{parse_tc_rate, HostWire, PerHost};
pub use port::{
    fair_shares, port_gbps_at, port_rate_at, port_shaped, PortGbps, PORT_RATE_VAR, WIRE,
};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub test: TestInfo,
    #[serde(default)]
    pub target: Vec<TargetSpec>,
    #[serde(default)]
    pub hosts: HostsSpec,
    pub workload: Workload,
    /// Defaults for template variables.
    #[serde(default)]
    pub vars: BTreeMap<String, toml::Value>,
    /// Each key takes every listed value; points are the cartesian product.
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    pub run: RunSpec,
    /// What `--quick` changes.
    #[serde(default)]
    pub quick: Option<QuickSpec>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TestInfo {
    /// Short id used in file names, e.g. `test03`.
    pub name: String,
    pub title: String,
    #[serde(default)]
    pub description: String,
    /// The sweep variable on the x axis of tables and plots (default `qd`
    /// when swept, else the first sweep variable).
    #[serde(default)]
    pub x: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    Iopace,
    Nbdkit,
    QemuNbd,
    NbdServer,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub name: String,
    pub kind: TargetKind,
    /// iopace: an inline TOML config template (the embedded default if
    /// neither this nor `config_file` is given).
    #[serde(default)]
    pub config: Option<String>,
    /// iopace: a config template file, relative to the scenario.
    #[serde(default)]
    pub config_file: Option<PathBuf>,
    /// Peers: the arguments after the listening options (nbdkit: plugin and
    /// its parameters; qemu-nbd: options and the image; nbd-server: the file).
    #[serde(default)]
    pub args: Vec<String>,
    /// iopace: the binary to run instead of this one (a template, e.g.
    /// "{{base_bin}}"), so two builds compare inside one run.
    #[serde(default)]
    pub bin: Option<String>,
    /// A sparse file of this size is created as `{{file}}` before the start.
    #[serde(default)]
    pub file_size: Option<String>,
    /// iopace: the capacity its listener gives for the target's port, in
    /// Gb/s, or `"wire"` for the shaped `port_rate`; written into the
    /// config the harness gives it (`[server] tcp = [{ addr, gbps, port }]`).
    /// Unset: the port is unknown to the pacer.
    #[serde(default)]
    pub port_gbps: Option<PortGbps>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostKind {
    /// fio servers on this machine, over loopback (or a Unix socket).
    #[default]
    Local,
    /// One network namespace per host behind a shaped veth pair.
    Netns,
    /// Real machines already running `fio --server`.
    Remote,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    #[default]
    Tcp,
    Unix,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostsSpec {
    #[serde(default)]
    pub kind: HostKind,
    #[serde(default = "one")]
    pub count: usize,
    /// tc rate per host and direction, e.g. "2gbit", or one per host, e.g.
    /// ["1gbit", "500mbit", "250mbit"] (netns only).
    #[serde(default)]
    pub rate: Option<PerHost>,
    /// netem delay each way, e.g. "100us", or one per host (netns only).
    #[serde(default)]
    pub delay: Option<PerHost>,
    /// tc rate of the target's port, which all hosts share, each way, e.g.
    /// "1gbit" (netns only): the target gets a veth of its own to the
    /// bridge, shaped on both ends.
    #[serde(default)]
    pub port_rate: Option<String>,
    /// The export each host's jobs use, the same or one per host, instead
    /// of every export of `[workload] exports` (which must list it): hosts
    /// in different tenants.
    #[serde(default)]
    pub export: Option<PerHost>,
    /// local only: Unix socket instead of loopback TCP.
    #[serde(default)]
    pub transport: Transport,
    /// remote only: the hosts' `fio --server` addresses.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// remote only: the target's address as the hosts reach it.
    #[serde(default)]
    pub target_address: Option<String>,
    #[serde(default = "default_fio_port")]
    pub fio_port: u16,
    #[serde(default = "default_nbd_port")]
    pub nbd_port: u16,
}

impl Default for HostsSpec {
    fn default() -> Self {
        HostsSpec {
            kind: HostKind::Local,
            count: 1,
            rate: None,
            delay: None,
            port_rate: None,
            export: None,
            transport: Transport::Tcp,
            addresses: Vec::new(),
            target_address: None,
            fio_port: default_fio_port(),
            nbd_port: default_nbd_port(),
        }
    }
}

fn one() -> usize {
    1
}
fn default_fio_port() -> u16 {
    8765
}
fn default_nbd_port() -> u16 {
    10809
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    #[serde(default = "default_rw")]
    pub rw: String,
    #[serde(default)]
    pub bs: Option<String>,
    #[serde(default)]
    pub bssplit: Option<String>,
    /// Total queue depth over all hosts, jobs and exports (the QD column of the tables).
    #[serde(default)]
    pub qd: Option<u32>,
    /// Queue depth per fio job; used when `qd` is not given.
    #[serde(default)]
    pub iodepth: Option<u32>,
    #[serde(default = "one_u32")]
    pub numjobs: u32,
    /// Each host runs `numjobs` jobs on every export listed.
    #[serde(default = "default_exports")]
    pub exports: Vec<String>,
    /// Measured seconds.
    #[serde(default = "default_runtime")]
    pub runtime: u32,
    /// Seconds before measuring.
    #[serde(default = "one_u32")]
    pub ramp: u32,
    #[serde(default = "default_size")]
    pub size: String,
    /// Any other fio options, passed through.
    #[serde(default)]
    pub fio: BTreeMap<String, String>,
    /// The iodepth of each job on the exports named here, instead of the
    /// point's: a QD 1 latency probe beside a saturating tenant.
    #[serde(default)]
    pub iodepth_of: BTreeMap<String, u32>,
}

fn default_rw() -> String {
    "randread".into()
}
fn one_u32() -> u32 {
    1
}
fn default_exports() -> Vec<String> {
    vec!["default".into()]
}
fn default_runtime() -> u32 {
    10
}
fn default_size() -> String {
    "1g".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Repetitions of every point and target.
    #[serde(default = "one_u32")]
    pub repeat: u32,
    /// Alternate the order of targets between repetitions and points.
    #[serde(default = "yes")]
    pub alternate: bool,
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            repeat: 1,
            alternate: true,
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuickSpec {
    #[serde(default)]
    pub runtime: Option<u32>,
    #[serde(default)]
    pub ramp: Option<u32>,
    #[serde(default)]
    pub repeat: Option<u32>,
    /// Replaces these sweep variables' value lists.
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
}

/// One combination of variable values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub index: usize,
    pub vars: BTreeMap<String, String>,
}

/// One execution: a point on a target, one repetition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunId {
    pub point: usize,
    pub target: usize,
    pub rep: u32,
}

impl RunId {
    pub fn key(&self, s: &Scenario) -> String {
        format!(
            "{}-p{:03}-{}-r{}",
            s.test.name, self.point, s.target[self.target].name, self.rep
        )
    }
}

/// A loaded scenario with where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub scenario: Scenario,
    pub path: PathBuf,
    pub text: String,
}

impl Loaded {
    pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
        Self::parse(&read_text(path)?, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Loaded, ConfigError> {
        let name = path.display().to_string();
        let scenario: Scenario = from_toml(text, &name)?;
        let loaded = Loaded {
            scenario,
            path: path.to_path_buf(),
            text: text.to_string(),
        };
        validate::validate(&loaded)?;
        Ok(loaded)
    }

    fn error(&self, table: &str, index: usize, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.path.display().to_string(),
            line: locate(&self.text, table, index, field),
            field: Some(format!("{table}.{field}")),
            message,
        }
    }

    /// Points the scenario at real hosts already running `fio --server`;
    /// the wire is theirs, so shaping is dropped (the caller says so).
    pub fn make_remote(&mut self, hosts: &[String], target_address: &str) {
        let h = &mut self.scenario.hosts;
        h.kind = HostKind::Remote;
        h.addresses = hosts.to_vec();
        h.target_address = Some(target_address.to_string());
        h.rate = None;
        h.delay = None;
        h.port_rate = None;
        h.transport = Transport::Tcp;
        self.scenario.sweep.remove("rate");
        self.scenario.sweep.remove("delay");
        self.scenario.sweep.remove(PORT_RATE_VAR);
    }

    /// Applies `--quick`: shorter runs and the quick sweep lists.
    /// `--var NAME=VALUE`: replaces a `[vars]` default. A name that is no
    /// `[vars]` key (a typo, or a swept variable, which the sweep would
    /// overwrite) is an error, not a run that silently keeps the default.
    pub fn set_var(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let Some(slot) = self.scenario.vars.get_mut(name) else {
            let known: Vec<&str> = self.scenario.vars.keys().map(String::as_str).collect();
            let swept = if self.scenario.sweep.contains_key(name) {
                " (it is swept: change its [sweep] list)"
            } else {
                ""
            };
            return Err(ConfigError {
                file: self.path.display().to_string(),
                line: None,
                field: Some("vars".to_string()),
                message: format!(
                    "--var `{name}`: no such variable{swept}; this scenario's [vars]: {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        };
        *slot = toml::Value::String(value.to_string());
        Ok(())
    }

    pub fn make_quick(&mut self) {
        let Some(q) = self.scenario.quick.clone() else {
            let w = &mut self.scenario.workload;
            w.runtime = w.runtime.min(3);
            w.ramp = w.ramp.min(1);
            self.scenario.run.repeat = 1;
            return;
        };
        let w = &mut self.scenario.workload;
        if let Some(r) = q.runtime {
            w.runtime = r.max(1);
        }
        if let Some(r) = q.ramp {
            w.ramp = r;
        }
        if let Some(r) = q.repeat {
            self.scenario.run.repeat = r.max(1);
        }
        for (k, v) in q.sweep {
            if !v.is_empty() {
                self.scenario.sweep.insert(k, v);
            }
        }
    }
}

impl Scenario {
    /// The x-axis variable.
    pub fn x_var(&self) -> Option<&str> {
        match &self.test.x {
            Some(x) => Some(x),
            None if self.sweep.contains_key("qd") => Some("qd"),
            None => self.sweep.keys().next().map(String::as_str),
        }
    }

    /// Every combination of sweep values, with `[vars]` defaults beneath.
    pub fn points(&self) -> Vec<Point> {
        let base: BTreeMap<String, String> = self
            .vars
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), value_text(v)?)))
            .collect();
        let mut combos = vec![base];
        for (k, vals) in &self.sweep {
            let mut next = Vec::with_capacity(combos.len() * vals.len());
            for c in &combos {
                for v in vals {
                    let mut c = c.clone();
                    c.insert(k.clone(), value_text(v).unwrap_or_default());
                    next.push(c);
                }
            }
            combos = next;
        }
        combos
            .into_iter()
            .enumerate()
            .map(|(index, vars)| Point { index, vars })
            .collect()
    }

    /// Runs in execution order: per point, every target per repetition, the
    /// target order rotating so no target always goes first. Points run
    /// grouped by their x value (see `execution_order`).
    pub fn runs(&self, points: &[Point]) -> Vec<RunId> {
        let n = self.target.len();
        let mut runs = Vec::new();
        let mut turn = 0usize;
        for p in self.execution_order(points) {
            for rep in 0..self.run.repeat {
                for k in 0..n {
                    let target = if self.run.alternate {
                        (k + turn) % n
                    } else {
                        k
                    };
                    runs.push(RunId {
                        point: p.index,
                        target,
                        rep,
                    });
                }
                turn += 1;
            }
        }
        runs
    }

    /// The points grouped by their x value, in the sweep's order: the
    /// series one plot compares at an x (modes, sizes) run back to back, not
    /// one series through every x and then the next, which put minutes of
    /// drift between the runs a table sets side by side. With `alternate`,
    /// each group's order rotates, so no series always goes first.
    fn execution_order<'a>(&self, points: &'a [Point]) -> Vec<&'a Point> {
        let xs = self
            .x_var()
            .and_then(|x| Some((x, self.sweep.get(x)?)))
            .map(|(x, vals)| (x, vals.iter().filter_map(value_text).collect::<Vec<_>>()));
        let Some((x, xs)) = xs else {
            return points.iter().collect();
        };
        let rank = |p: &Point| {
            p.vars
                .get(x)
                .and_then(|v| xs.iter().position(|w| w == v))
                .unwrap_or(usize::MAX)
        };
        let mut order: Vec<&Point> = points.iter().collect();
        order.sort_by_key(|p| rank(p)); // stable: series keep their order
        if self.run.alternate {
            for (g, group) in order.chunk_by_mut(|a, b| rank(a) == rank(b)).enumerate() {
                let len = group.len();
                group.rotate_left(g % len);
            }
        }
        order
    }

    /// Workload at a point: sweep variables override the file's values.
    pub fn workload_at(&self, p: &Point) -> Workload {
        let mut w = self.workload.clone();
        let num = |k: &str| p.vars.get(k).and_then(|v| v.parse::<u32>().ok());
        if let Some(v) = p.vars.get("rw") {
            w.rw = v.clone();
        }
        if let Some(v) = p.vars.get("bs") {
            w.bs = Some(v.clone());
        }
        if let Some(v) = num("numjobs") {
            w.numjobs = v;
        }
        if let Some(v) = num("iodepth") {
            w.iodepth = Some(v);
            w.qd = None;
        }
        if let Some(v) = num("qd") {
            w.qd = Some(v);
        }
        if let Some(v) = p.vars.get("jobs") {
            jobs::apply(&mut w, v);
        }
        w
    }

    /// Each host's wire at a point: a swept `rate` or `delay` applies to
    /// every host, else the `[hosts]` value (the same, or one per host).
    pub fn wire_at(&self, p: &Point) -> Vec<HostWire> {
        let pick = |var: &str, spec: &Option<PerHost>, i: usize| {
            p.vars
                .get(var)
                .cloned()
                .or_else(|| spec.as_ref()?.host(i).map(str::to_string))
        };
        (0..self.host_count())
            .map(|i| HostWire {
                rate: pick("rate", &self.hosts.rate, i),
                delay: pick("delay", &self.hosts.delay, i),
            })
            .collect()
    }

    /// Each host's workload at a point: its own export where `[hosts]
    /// export` names one.
    pub fn host_workloads(&self, p: &Point) -> Vec<Workload> {
        let w = self.workload_at(p);
        (0..self.host_count())
            .map(|i| {
                let mut w = w.clone();
                if let Some(e) = self.hosts.export.as_ref().and_then(|e| e.host(i)) {
                    w.exports = vec![e.to_string()];
                }
                w
            })
            .collect()
    }

    pub fn host_count(&self) -> usize {
        match self.hosts.kind {
            HostKind::Remote => self.hosts.addresses.len(),
            _ => self.hosts.count,
        }
    }
}

impl Workload {
    /// fio jobs per host.
    pub fn jobs_per_host(&self) -> u32 {
        self.numjobs * self.exports.len() as u32
    }

    /// Per-job iodepth: the total `qd` divided over every job of every host.
    pub fn job_iodepth(&self, hosts: usize) -> u32 {
        match self.qd {
            Some(qd) => (qd / (self.jobs_per_host() * hosts as u32).max(1)).max(1),
            None => self.iodepth.unwrap_or(1),
        }
    }

    /// The total queue depth actually offered (`iodepth_of` included).
    pub fn total_qd(&self, hosts: usize) -> u32 {
        self.host_qd(hosts) * hosts as u32
    }

    /// The queue depth one of `hosts` hosts offers.
    pub fn host_qd(&self, hosts: usize) -> u32 {
        let depth = self.job_iodepth(hosts);
        let per_round: u32 = self
            .exports
            .iter()
            .map(|e| self.iodepth_of.get(e).copied().unwrap_or(depth))
            .sum();
        per_round * self.numjobs
    }
}

/// A TOML scalar as text.
pub fn value_text(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Fills `{{name}}` placeholders; an unknown name is an error naming it.
/// Innermost first, and values may hold placeholders themselves, so
/// `{{tuner_{{method}}}}` picks a variable by another's value.
pub fn render(template: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut text = template.to_string();
    // Text before `from` holds no placeholder (a lone `}}` closes a TOML
    // inline table).
    let mut from = 0;
    // Bounded: a variable that refers to itself must not loop forever.
    for _ in 0..10_000 {
        let Some(close) = text[from..].find("}}").map(|i| i + from) else {
            break;
        };
        let Some(open) = text[from..close].rfind("{{").map(|i| i + from) else {
            from = close + 2;
            continue;
        };
        let name = text[open + 2..close].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| format!("`{{{{{name}}}}}` has no value: add it to [vars] or [sweep]"))?;
        text.replace_range(open..close + 2, value);
    }
    if text.contains("{{") {
        return Err("an unclosed `{{` placeholder (or one that never resolves)".into());
    }
    Ok(text)
}

/// "1GiB", "512m", "4k", "1048576" as bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let mult = match s[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests;
