//! The iopace command line: serve, stats, sim, bench.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod probe_cli;
mod stats_report;

#[derive(Parser)]
#[command(
    name = "iopace",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("IOPACE_GIT_COMMIT"), ")"),
    about = "A paced NBD block-storage target on io_uring"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// Log format on stderr: text, or json (one object per line). The level
    /// and filters come from IOPACE_LOG (default "info", rustls "error"), e.g.
    /// IOPACE_LOG=debug or IOPACE_LOG=server=debug,info.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the configured exports over NBD until SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Print the statistics of a running target, per reactor.
    Stats(StatsArgs),
    /// Call one admin JSON-RPC method of a running target and print its result.
    Rpc(RpcArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff), as `make install` installs it.
    Manpage,
    /// Run simulation scenarios (TOML) through the target's engine and pacer, and print one sweep table per run.
    Sim(SimArgs),
    /// Run benchmark scenarios (TOML) with real fio initiators against
    /// iopace or a peer server; writes tables, results.json/csv, PNG plots
    /// and report.md.
    Bench(BenchArgs),
    /// Measure devices on iopace's own bdev path: the cost model, IOPS and
    /// latency against QD, the knee, scaling; writes report.md, result.json,
    /// a [cost.NAME] snippet and Linux's io.cost.model line (--apply writes
    /// it into a cgroup2 root). `probe db` keeps results by model.
    Probe(probe_cli::ProbeCmd),
    /// Find a device's latency targets and vrate bounds: a QD 1 probe beside
    /// a saturating reader throttled to vrate points; prints [qos.NAME] and
    /// Linux's io.cost.qos lines (--apply writes them into a cgroup2 root).
    Tune(probe_cli::TuneArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// Scenario files, e.g. scenarios/quick.toml; each becomes one test
    /// section of the report.
    #[arg(required = true, value_name = "SCENARIO.toml")]
    scenarios: Vec<PathBuf>,
    /// The short version: each scenario's [quick] settings (or 3 s runs).
    #[arg(long)]
    quick: bool,
    /// Output directory (default bench-out/<first scenario name>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Keep the runs already saved in the output directory and do the rest.
    #[arg(long)]
    resume: bool,
    /// Run the same scenarios on real initiator hosts: their `fio --server`
    /// addresses, comma-separated (each host runs `fio --server` itself; a
    /// scenario's wire shaping does not apply to real links).
    #[arg(
        long,
        value_name = "ADDR,ADDR",
        value_delimiter = ',',
        requires = "target_address"
    )]
    remote_hosts: Vec<String>,
    /// With --remote-hosts: the address this machine's target listens on and
    /// the hosts connect to.
    #[arg(long, value_name = "ADDR")]
    target_address: Option<String>,
    /// Sets a scenario variable, replacing its `[vars]` default (repeatable),
    /// e.g. --var base_bin=/path/to/an/older/iopace.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    vars: Vec<(String, String)>,
}

/// `iopace sim`: scenario files, the fuzzer or the fault cases, with the
/// mechanisms `--ablate` names taken out of the pacer first.
fn sim(args: SimArgs) -> ExitCode {
    let taken = pace::pacer::ablate::take_out(&args.ablate);
    debug_assert!(taken, "mechanisms are taken out once per process");
    if args.faults.is_some() {
        return sim_faults(args);
    }
    if args.fuzz.is_some() {
        let fuzz = sim::fuzz::FuzzArgs {
            cases: sim_cases(&args, args.fuzz),
            out: args.out,
            variant: sim::fuzz::Variant {
                mode: args.mode,
                qd_scale: args.qd_scale,
            },
        };
        return ExitCode::from(sim::fuzz::fuzz(&fuzz) as u8);
    }
    let out = sim::Output {
        json: args.json,
        trace: args.trace,
    };
    ExitCode::from(sim::run(&args.scenarios, out) as u8)
}

/// `iopace sim --faults SEED ...`.
fn sim_faults(args: SimArgs) -> ExitCode {
    let faults = sim_cases(&args, args.faults);
    ExitCode::from(sim::faults::faults(&faults) as u8)
}

/// The cases a fuzzer (`--fuzz` or `--faults`, from `seed`) runs.
fn sim_cases(args: &SimArgs, seed: Option<u64>) -> sim::jobs::Cases {
    sim::jobs::Cases {
        seed: seed.unwrap_or(0),
        count: args.count,
        index: args.index,
        json: args.json,
        jobs: args.jobs,
    }
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=VALUE"))?;
    Ok((name.to_string(), value.to_string()))
}

#[derive(Args)]
struct SimArgs {
    /// Scenario files, e.g. scenarios/sim/test03_none.toml.
    #[arg(required_unless_present_any = ["fuzz", "faults"], value_name = "SCENARIO.toml")]
    scenarios: Vec<String>,
    /// Generate random scenarios from this seed instead, run each under
    /// `auto` and score it against the fairness oracle.
    #[arg(long, value_name = "SEED", conflicts_with = "scenarios")]
    fuzz: Option<u64>,
    /// Generate small random targets from this seed instead and run each
    /// under faults (device errors and stalls, resets, clients that stop
    /// reading, link flaps, pacing switches, drains), checking the engine's
    /// books after every event and that every IO and buffer comes back.
    #[arg(long, value_name = "SEED", conflicts_with_all = ["scenarios", "fuzz"])]
    faults: Option<u64>,
    /// With --fuzz or --faults: how many cases.
    #[arg(long, default_value_t = 100)]
    count: u64,
    /// With --fuzz or --faults: only this case (the repro the report prints).
    #[arg(long)]
    index: Option<u64>,
    /// With --fuzz: the pacing mode every case runs under. The goals are
    /// `auto`'s; `none` on the same cases shows which misses the pacer
    /// causes and which it inherits from the engine or the hardware.
    #[arg(long, default_value = "auto", requires = "fuzz")]
    mode: pace::pacer::Mode,
    /// With --fuzz: multiply each case's QD by this (a QD 1 tenant's host
    /// stays at 1), the hardware and load otherwise the same. A miss that
    /// goes away at a larger QD is a QD knee: the host's QD nearly binds,
    /// and a closed loop reaches the oracle's bound (QD over the unloaded
    /// round trip) only well past it. See docs/pacer.md.
    #[arg(long, default_value_t = 1, value_name = "K", requires = "fuzz",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    qd_scale: u32,
    /// With --fuzz: write each failing case's scenario file here.
    #[arg(long, value_name = "DIR", requires = "fuzz")]
    out: Option<PathBuf>,
    /// Take these mechanisms out of the pacer, to measure what each one
    /// wins (comma-separated): depth, gate, latency-probe, drain-probe,
    /// stall, ports, light, hold-ratio, device-queue, device-share,
    /// flow-fair, fair-part, device-waiter, link-waiter, hold-peers,
    /// uncontended, tenant-part. See docs/pacer.md.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    ablate: Vec<pace::pacer::ablate::Mechanism>,
    /// With --fuzz or --faults: worker threads (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Print every reactor's pacer state (window, rate, min latency, bytes
    /// in flight, queue) each simulated millisecond, to stderr.
    #[arg(long)]
    trace: bool,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file. Without it the embedded default is served:
    /// exports `default` (1 GiB RAM), `null` (1 GiB, reads return 0xA5) and
    /// `slow` (1 GiB RAM behind a 1 ms delay).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP address to listen on (repeatable), replacing the config's list;
    /// `none` disables TCP.
    #[arg(long, value_name = "ADDR:PORT")]
    tcp: Vec<String>,
    /// Unix socket path to listen on (repeatable), replacing the config's
    /// list; `none` disables Unix sockets.
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,
    /// NVMe/TCP address to listen on (repeatable), replacing the config's
    /// list; `none` disables NVMe/TCP.
    #[arg(long, value_name = "ADDR:PORT")]
    nvme_tcp: Vec<String>,
    /// Admin JSON-RPC socket path; `none` disables it.
    #[arg(long, value_name = "PATH")]
    rpc: Option<PathBuf>,
    /// Number of reactor threads (one per core); 0 means one per CPU.
    #[arg(long, value_name = "N")]
    reactors: Option<usize>,
    /// Pacing mode, replacing the config's [pacing] mode: none, buffers,
    /// rate (needs period_us in the config) or auto.
    #[arg(long, value_name = "MODE")]
    pacing: Option<String>,
    /// Check the configuration, print it as JSON and exit without serving;
    /// creates, extends and binds nothing.
    #[arg(long)]
    check: bool,
}

#[derive(Args)]
struct StatsArgs {
    /// Admin socket of the target.
    #[arg(long, value_name = "PATH", default_value = "/tmp/iopace-admin.sock")]
    rpc: PathBuf,
    /// Print the raw JSON instead of the report.
    #[arg(long)]
    json: bool,
    /// Print it again every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
}

#[derive(Args)]
struct RpcArgs {
    /// get_stats, get_config, set_pacing, set_fault, get_faults, add_dirty_bitmap,
    /// remove_dirty_bitmap, clear_dirty_bitmap, get_dirty_bitmaps, trace or rpc_get_methods.
    method: String,
    /// The params as JSON, e.g. '{"mode":"rate","period_us":500}'.
    params: Option<String>,
    /// Admin socket of the target.
    #[arg(long, value_name = "PATH", default_value = "/tmp/iopace-admin.sock")]
    rpc: PathBuf,
}

/// The log filter without IOPACE_LOG. rustls warns about what peers send
/// (GnuTLS clients put the address they dialled in SNI), once a connection;
/// the server logs failed handshakes itself.
const DEFAULT_LOG: &str = "info,rustls=error";

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The simulator opens and closes connections by the thousand (NVMe/TCP
    // hosts' Connects, the fault fuzzer's resets): only warnings.
    let quiet = matches!(&cli.command, Cmd::Sim(_));
    let default_log = if quiet { "warn" } else { DEFAULT_LOG };
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IOPACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log)),
        );
    match cli.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    match cli.command {
        Cmd::Serve(args) => serve(args),
        Cmd::Stats(args) => stats(args),
        Cmd::Rpc(args) => rpc(args),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "iopace", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Cmd::Manpage => {
            use clap::CommandFactory;
            match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("iopace manpage: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Sim(args) => sim(args),
        Cmd::Bench(args) => bench(args),
        Cmd::Probe(args) => probe_cli::probe_or_db(args),
        Cmd::Tune(args) => probe_cli::tune(args),
    }
}

fn bench(args: BenchArgs) -> ExitCode {
    let out = args.out.clone().unwrap_or_else(|| {
        let stem = args.scenarios[0]
            .file_stem()
            .map_or_else(|| "bench".into(), |s| s.to_string_lossy().to_string());
        PathBuf::from("bench-out").join(stem)
    });
    let iopace_bin = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("iopace bench: cannot find its own binary: {e}");
            return ExitCode::from(1);
        }
    };
    if out.exists() && !args.resume {
        // A fresh run must not mix with saved runs of an older one.
        let _ = std::fs::remove_dir_all(out.join("runs"));
    }
    let remote = args.target_address.map(|target_address| bench::Remote {
        hosts: args.remote_hosts.clone(),
        target_address,
    });
    if remote.as_ref().is_some_and(|r| r.hosts.is_empty()) {
        eprintln!("iopace bench: --target-address needs --remote-hosts");
        return ExitCode::from(2);
    }
    let opts = bench::Options {
        quick: args.quick,
        remote,
        out: out.clone(),
        resume: args.resume,
        iopace_bin,
        vars: args.vars.clone(),
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    match bench::bench(&args.scenarios, &opts, command) {
        Ok(_) => {
            println!(
                "\nreport: {}\nresults: {} and {}\nplots: {}/*.png",
                out.join("report.md").display(),
                out.join("results.json").display(),
                out.join("results.csv").display(),
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e @ bench::BenchError::Config(_)) => {
            eprintln!("iopace bench: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("iopace bench: {e}");
            if args.resume || out.join("runs").exists() {
                eprintln!("finished runs are saved; add --resume to continue");
            }
            ExitCode::from(1)
        }
    }
}

fn is_none(s: &str) -> bool {
    s == "none"
}

fn serve(args: ServeArgs) -> ExitCode {
    let mut loaded = match server::Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("iopace: config error: {e}");
            return ExitCode::from(2);
        }
    };
    let check = args.check;
    if let Err(e) = apply_overrides(args, &mut loaded) {
        eprintln!("iopace: {e}");
        return ExitCode::from(2);
    }
    if check {
        let checked =
            server::exports::Catalog::check(&loaded).and_then(|_| server::tls::config_of(&loaded));
        return match checked {
            Ok(_) => {
                println!("{:#}", loaded.to_json());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("iopace: config error: {e}");
                ExitCode::from(2)
            }
        };
    }
    match server::serve(loaded) {
        Ok(()) => ExitCode::SUCCESS,
        Err(server::ServeError::Config(e)) => {
            eprintln!("iopace: config error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("iopace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Puts the command line's listener, reactor and pacing options over the
/// config's, with the same bounds.
fn apply_overrides(args: ServeArgs, loaded: &mut server::LoadedConfig) -> Result<(), String> {
    let server = &mut loaded.config.server;
    if !args.tcp.is_empty() {
        server.tcp = args
            .tcp
            .into_iter()
            .filter(|s| !is_none(s))
            .map(config::TcpListenerConfig::Addr)
            .collect();
    }
    if !args.unix.is_empty() {
        server.unix = args
            .unix
            .into_iter()
            .filter(|p| !is_none(&p.to_string_lossy()))
            .collect();
    }
    if !args.nvme_tcp.is_empty() {
        server.nvme_tcp = args
            .nvme_tcp
            .into_iter()
            .filter(|s| !is_none(s))
            .map(config::TcpListenerConfig::Addr)
            .collect();
    }
    if let Some(rpc) = args.rpc {
        server.rpc = if is_none(&rpc.to_string_lossy()) {
            PathBuf::new()
        } else {
            rpc
        };
    }
    if let Some(n) = args.reactors {
        server.reactors = n;
    }
    for listener in &server.tcp {
        config::check_tcp_address(listener.addr()).map_err(|e| format!("--tcp: {e}"))?;
    }
    for path in &server.unix {
        config::check_socket_path(path).map_err(|e| format!("--unix: {e}"))?;
    }
    for listener in &server.nvme_tcp {
        config::check_tcp_address(listener.addr()).map_err(|e| format!("--nvme-tcp: {e}"))?;
    }
    if !server.rpc.as_os_str().is_empty() {
        config::check_socket_path(&server.rpc).map_err(|e| format!("--rpc: {e}"))?;
    }
    let max = config::bounds::MAX_REACTORS;
    if server.reactors > max {
        return Err(format!(
            "--reactors: at most {max}, got {}",
            server.reactors
        ));
    }
    if server.tcp.is_empty() && server.unix.is_empty() && server.nvme_tcp.is_empty() {
        return Err("no listener left: give --tcp, --unix or --nvme-tcp".into());
    }
    if let Some(mode) = &args.pacing {
        let pacing = &mut loaded.config.pacing;
        pacing.mode = serde_json::from_value(serde_json::Value::String(mode.clone()))
            .map_err(|_| format!("--pacing `{mode}`: use none, buffers, rate or auto"))?;
        config::bounds::check_pacing(pacing)
            .map_err(|(field, msg)| format!("--pacing {mode}: [pacing] {field}: {msg}"))?;
    }
    Ok(())
}

fn stats(args: StatsArgs) -> ExitCode {
    let interval = args.watch.map(|secs| {
        std::time::Duration::try_from_secs_f64(secs.max(0.1))
            .unwrap_or(std::time::Duration::from_secs(1))
    });
    loop {
        let code = stats_once(&args);
        match interval {
            Some(every) if code == ExitCode::SUCCESS => std::thread::sleep(every),
            _ => return code,
        }
    }
}

/// Writes `text` to stdout. A reader that went away (`iopace rpc ... |
/// head`) is not an error: the output was for it alone.
fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("iopace: stdout: {e}");
        }
    }
}

fn stats_once(args: &StatsArgs) -> ExitCode {
    let printed = if args.json {
        admin::call(&args.rpc, "get_stats", serde_json::Value::Null)
            .map(|v| print_out(&format!("{v:#}\n")))
    } else {
        admin::get_stats(&args.rpc).map(|reply| print_out(&stats_report::render(&reply)))
    };
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iopace: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rpc(args: RpcArgs) -> ExitCode {
    let params = match args.params.as_deref().map(serde_json::from_str).transpose() {
        Ok(p) => p.unwrap_or(serde_json::Value::Null),
        Err(e) => {
            eprintln!("iopace rpc: params are not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    match admin::call(&args.rpc, &args.method, params) {
        Ok(v) => {
            print_out(&format!("{v:#}\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iopace rpc: {e}");
            ExitCode::FAILURE
        }
    }
}
