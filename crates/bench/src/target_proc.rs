//! Starting a target under test: iopace with a rendered config, or a peer
//! (nbdkit, qemu-nbd, nbd-server) with its arguments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::procs::{self, Proc};
use crate::scenario::{render, TargetKind, TargetSpec};

/// The target's embedded default config (`config::DEFAULT_CONFIG`), read
/// from its file so that bench links no config, devices or io_uring; a
/// test checks the two are the same text.
const DEFAULT_CONFIG: &str = include_str!("../../config/src/default.toml");

/// Where a target listens.
#[derive(Debug, Clone)]
pub enum Listen {
    Tcp { addr: String, port: u16 },
    Unix(PathBuf),
}

impl Listen {
    /// The fio nbd engine's URI for an export.
    pub fn uri(&self, export: &str) -> String {
        match self {
            Listen::Tcp { addr, port } => format!("nbd://{addr}:{port}/{export}"),
            Listen::Unix(p) => format!("nbd+unix:///{export}?socket={}", p.display()),
        }
    }
}

/// A running target.
pub struct Running {
    pub proc: Proc,
    /// iopace's admin socket.
    pub rpc: Option<PathBuf>,
}

pub struct StartCtx<'a> {
    pub iopace_bin: &'a Path,
    /// The scenario file's directory, for relative config files.
    pub scenario_dir: &'a Path,
    /// Scratch space for this run: configs, sockets, logs.
    pub run_dir: &'a Path,
    pub listen: &'a Listen,
    pub vars: &'a BTreeMap<String, String>,
    /// Export names the workload uses (a peer serves the first).
    pub exports: &'a [String],
    /// iopace: the capacity, Gb/s, its TCP listener gives for its port.
    pub port_gbps: Option<f64>,
}

fn tool_package(kind: TargetKind) -> (&'static str, &'static str) {
    match kind {
        TargetKind::Iopace => ("iopace", "iopace"),
        TargetKind::Nbdkit => ("nbdkit", "nbdkit"),
        TargetKind::QemuNbd => ("qemu-nbd", "qemu-utils"),
        TargetKind::NbdServer => ("nbd-server", "nbd-server"),
    }
}

/// Checks that a target's program is installed.
pub fn preflight(spec: &TargetSpec) -> Result<(), String> {
    if spec.kind == TargetKind::Iopace {
        return Ok(());
    }
    let (tool, pkg) = tool_package(spec.kind);
    procs::require(tool, pkg)
}

/// How to start one target: its command, and the files that tell it is up.
struct Launch {
    cmd: Command,
    /// iopace's admin socket.
    rpc: Option<PathBuf>,
    /// A daemon held by its pidfile.
    pidfile: Option<PathBuf>,
}

impl Launch {
    fn plain(cmd: Command) -> Launch {
        Launch {
            cmd,
            rpc: None,
            pidfile: None,
        }
    }
}

pub fn start(spec: &TargetSpec, ctx: &StartCtx) -> Result<Running, String> {
    let args: Vec<String> = spec
        .args
        .iter()
        .map(|a| render(a, ctx.vars))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("target `{}` args: {e}", spec.name))?;
    let log = ctx.run_dir.join(format!("{}.log", spec.name));
    let export = ctx.exports.first().map_or("default", String::as_str);
    let launch = match spec.kind {
        TargetKind::Iopace => iopace_launch(spec, ctx, &args)?,
        TargetKind::Nbdkit => Launch::plain(nbdkit_command(ctx.listen, &args)),
        TargetKind::QemuNbd => Launch::plain(qemu_nbd_command(ctx.listen, export, &args)),
        TargetKind::NbdServer => nbd_server_launch(ctx, export, &args)?,
    };
    let mut proc = match &launch.pidfile {
        Some(pidfile) => Proc::spawn_daemon(&spec.name, launch.cmd, &log, pidfile)?,
        None => Proc::spawn(&spec.name, launch.cmd, &log)?,
    };
    let listen = ctx.listen.clone();
    proc.wait_ready("listening", || match &listen {
        Listen::Tcp { addr, port } => procs::tcp_accepts(&format!("{addr}:{port}")),
        Listen::Unix(p) => std::os::unix::net::UnixStream::connect(p).is_ok(),
    })?;
    if let Some(r) = &launch.rpc {
        let r = r.clone();
        proc.wait_ready("admin socket", move || {
            std::os::unix::net::UnixStream::connect(&r).is_ok()
        })?;
    }
    Ok(Running {
        proc,
        rpc: launch.rpc,
    })
}

fn iopace_launch(spec: &TargetSpec, ctx: &StartCtx, args: &[String]) -> Result<Launch, String> {
    let rpc_path = ctx.run_dir.join("admin.sock");
    let bin = match &spec.bin {
        Some(b) => PathBuf::from(
            render(b, ctx.vars).map_err(|e| format!("target `{}` bin: {e}", spec.name))?,
        ),
        None => ctx.iopace_bin.to_path_buf(),
    };
    let mut cmd = Command::new(bin);
    cmd.arg("serve");
    let mut config = iopace_config(spec, ctx)?;
    match (ctx.listen, ctx.port_gbps) {
        // `--tcp` would replace the config's listeners, capacity and all.
        (Listen::Tcp { addr, port }, Some(gbps)) => {
            let base = config.as_deref().unwrap_or(DEFAULT_CONFIG);
            config = Some(with_port_listener(base, &format!("{addr}:{port}"), gbps)?);
            cmd.args(["--unix", "none"]);
        }
        (Listen::Tcp { addr, port }, None) => {
            cmd.arg("--tcp").arg(format!("{addr}:{port}"));
            cmd.args(["--unix", "none"]);
        }
        (Listen::Unix(p), _) => {
            cmd.args(["--tcp", "none", "--unix"]).arg(p);
        }
    }
    if let Some(config) = config {
        let path = ctx.run_dir.join(format!("{}.toml", spec.name));
        std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
        cmd.arg("--config").arg(path);
    }
    // The embedded default also serves NVMe/TCP on 4420; bench runs do not
    // (an older build named by `bin` has no such option, nor NVMe/TCP).
    if spec.bin.is_none() {
        cmd.args(["--nvme-tcp", "none"]);
    }
    cmd.arg("--rpc").arg(&rpc_path).args(args);
    Ok(Launch {
        cmd,
        rpc: Some(rpc_path),
        pidfile: None,
    })
}

fn nbdkit_command(listen: &Listen, args: &[String]) -> Command {
    let mut cmd = Command::new("nbdkit");
    cmd.args(["--foreground", "--exit-with-parent"]);
    match listen {
        Listen::Tcp { addr, port } => cmd.args(["-i", addr, "-p", &port.to_string()]),
        Listen::Unix(p) => cmd.arg("-U").arg(p),
    };
    cmd.args(args);
    cmd
}

fn qemu_nbd_command(listen: &Listen, export: &str, args: &[String]) -> Command {
    let mut cmd = Command::new("qemu-nbd");
    cmd.args(["--persistent", "--shared=64", "-x", export]);
    match listen {
        Listen::Tcp { addr, port } => cmd.args(["-b", addr, "-p", &port.to_string()]),
        Listen::Unix(p) => cmd.arg("-k").arg(p),
    };
    cmd.args(args);
    cmd
}

fn nbd_server_launch(ctx: &StartCtx, export: &str, args: &[String]) -> Result<Launch, String> {
    let Listen::Tcp { addr, port } = ctx.listen else {
        return Err("nbd-server is driven over TCP only here".into());
    };
    let file = args
        .first()
        .ok_or("nbd-server needs the file to export as its first arg")?;
    let cfg = ctx.run_dir.join("nbd-server.conf");
    let text = format!(
        "[generic]\nlistenaddr = {addr}\nport = {port}\n\n[{export}]\nexportname = {file}\n"
    );
    std::fs::write(&cfg, text).map_err(|e| format!("{}: {e}", cfg.display()))?;
    // It forks per connection only as a daemon: held by its pidfile.
    let pidfile = ctx.run_dir.join("nbd-server.pid");
    let mut cmd = Command::new("nbd-server");
    cmd.arg("-C")
        .arg(&cfg)
        .arg("-p")
        .arg(&pidfile)
        .args(&args[1..]);
    Ok(Launch {
        cmd,
        rpc: None,
        pidfile: Some(pidfile),
    })
}

/// The rendered config of an iopace target; None means the embedded default.
fn iopace_config(spec: &TargetSpec, ctx: &StartCtx) -> Result<Option<String>, String> {
    let template = match (&spec.config, &spec.config_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => {
            let path = ctx.scenario_dir.join(file);
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        (None, None) => return Ok(None),
    };
    render(&template, ctx.vars)
        .map(Some)
        .map_err(|e| format!("target `{}` config: {e}", spec.name))
}

/// The name the harness gives the target's port in the config it writes.
pub const PORT_NAME: &str = "bench";

/// `config` (a rendered iopace config) with its TCP listeners replaced by
/// one on `addr` whose port has `gbps` of capacity, so the pacer knows it.
fn with_port_listener(config: &str, addr: &str, gbps: f64) -> Result<String, String> {
    let mut doc: toml::Table =
        toml::from_str(config).map_err(|e| format!("the target's config: {e}"))?;
    let server = doc
        .entry("server")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(server) = server else {
        return Err("the target's config: `server` is not a table".into());
    };
    let mut listener = toml::Table::new();
    listener.insert("addr".into(), toml::Value::String(addr.into()));
    listener.insert("gbps".into(), toml::Value::Float(gbps));
    listener.insert("port".into(), toml::Value::String(PORT_NAME.into()));
    let listeners = vec![toml::Value::Table(listener)];
    server.insert("tcp".into(), toml::Value::Array(listeners));
    toml::to_string(&doc).map_err(|e| format!("the target's config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports_of(text: &str) -> config::ports::WirePorts {
        let loaded = config::Config::parse(text, "written.toml").expect("the target reads it");
        config::ports::WirePorts::of(&loaded.config.server)
    }

    #[test]
    fn the_default_config_is_the_targets() {
        assert_eq!(DEFAULT_CONFIG, config::DEFAULT_CONFIG);
    }

    #[test]
    fn the_written_config_gives_the_listener_its_port_capacity() {
        let text = with_port_listener(config::DEFAULT_CONFIG, "10.77.0.1:10809", 1.5)
            .expect("the default config takes a listener");
        let ports = ports_of(&text);
        assert_eq!(ports.gbps, [1.5]);
        assert_eq!(ports.names, [PORT_NAME]);
        assert_eq!(ports.tcp, [Some(0)], "the one TCP listener is on it");
        let loaded = config::Config::parse(&text, "written.toml").expect("parses");
        let server = &loaded.config.server;
        assert_eq!(server.tcp.len(), 1);
        assert_eq!(server.tcp[0].addr(), "10.77.0.1:10809");
        // The rest of the default stays: its exports and pacing.
        assert!(loaded.config.exports.iter().any(|e| e.name == "default"));
    }

    #[test]
    fn a_scenario_config_keeps_its_tables_and_loses_only_its_tcp_listeners() {
        let scenario = "[server]\nreactors = 2\ntcp = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n\
                        [pacing]\nmode = \"auto\"\n\
                        [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                        [[export]]\nname = \"a\"\nbdev = \"m\"\n";
        let text = with_port_listener(scenario, "10.77.0.1:10809", 25.0).expect("written");
        let loaded = config::Config::parse(&text, "written.toml").expect("parses");
        assert_eq!(loaded.config.server.reactors, 2);
        assert_eq!(loaded.config.server.tcp.len(), 1);
        assert_eq!(ports_of(&text).gbps, [25.0]);
        // No [server] table at all: one is made.
        let bare = "[[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = \"1M\"\n\
                    [[export]]\nname = \"a\"\nbdev = \"m\"\n";
        let text = with_port_listener(bare, "127.0.0.1:9", 0.5).expect("written");
        assert_eq!(ports_of(&text).gbps, [0.5]);
        assert!(with_port_listener("server = 1", "127.0.0.1:9", 1.0).is_err());
    }
}
