//! `iopace probe` and `iopace tune`: the command-line side of the probe crate.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ProbeCmd {
    #[command(subcommand)]
    db: Option<DbCmd>,
    #[command(flatten)]
    args: ProbeArgs,
}

#[derive(Subcommand)]
enum DbCmd {
    /// The results database: probe results keyed by model and firmware.
    Db {
        #[command(subcommand)]
        action: DbAction,
    },
}

#[derive(Subcommand)]
enum DbAction {
    /// Add every device of a probe's result.json as one run, or a tune
    /// result.json's solutions as its model's iocost solutions.
    Add {
        #[arg(value_name = "DB-DIR")]
        db: PathBuf,
        #[arg(value_name = "result.json", required = true)]
        results: Vec<PathBuf>,
    },
    /// Merge each model's runs into merged.json (the median), with their spread.
    Merge {
        #[arg(value_name = "DB-DIR")]
        db: PathBuf,
    },
    /// Print every model and firmware with its merged cost model and spread.
    Show {
        #[arg(value_name = "DB-DIR")]
        db: PathBuf,
    },
    /// Import iocost-benchmarks' hwdb file: each model's solutions, and the
    /// default solution's cost model as a run.
    Import {
        #[arg(value_name = "DB-DIR")]
        db: PathBuf,
        #[arg(value_name = "FILE.hwdb", required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the database as an iocost-benchmarks hwdb file: each model's
    /// cost model and QoS solutions (tuned ones if added, else vrate 100%).
    Export {
        #[arg(value_name = "DB-DIR")]
        db: PathBuf,
    },
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Devices to probe: block devices or files (opened with O_DIRECT), or
    /// bdev names of --config. Several are also measured all at once.
    #[arg(required = true, value_name = "BDEV-or-PATH")]
    targets: Vec<String>,
    /// An iopace config whose bdevs (model, malloc, file, ...) may be named.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// The vendor's rated numbers, for a "% of spec" table.
    #[arg(long, value_name = "SPEC.toml")]
    spec: Option<PathBuf>,
    /// Output directory for report.md, result.json, plots and cost snippets.
    #[arg(long, value_name = "DIR", default_value = "probe-out")]
    out: PathBuf,
    /// Allow write measurements on this path, destroying its data
    /// (repeatable). A device holding a filesystem is refused anyway.
    #[arg(long, value_name = "PATH")]
    destructive: Vec<PathBuf>,
    /// Short points (20 ms windows; 3 rounds of 0.1 s, curves 0.4 s) and QD up to 64.
    #[arg(long)]
    quick: bool,
    /// Highest queue depth of the curves.
    #[arg(long, value_name = "QD", default_value_t = 256)]
    max_qd: u32,
    /// Most worker threads in the scaling runs (default: CPUs, at most 8).
    #[arg(long, value_name = "N")]
    threads: Option<u32>,
    /// Rounds of the cost, datasheet and held-out points, measured in turn
    /// (0.5 s each); each point is its median round (default: 4, and more
    /// until the cost points' rounds agree within ±3%, at most 10; quick 3).
    #[arg(long, value_name = "N")]
    rounds: Option<u32>,
    #[command(flatten)]
    kernel: KernelArgs,
}

/// Where the Linux iocost lines go.
#[derive(Args)]
struct KernelArgs {
    /// The MAJ:MIN the io.cost lines name (default: the disk of the target;
    /// a `model` bdev or a file on tmpfs has none: 0:0, a placeholder).
    #[arg(long, value_name = "MAJ:MIN", value_parser = parse_devnum)]
    devnum: Option<probe::iocost::DevNum>,
    /// Write the io.cost lines into this cgroup2 root (e.g. /sys/fs/cgroup);
    /// says why not where the kernel offers no iocost files there.
    #[arg(long, value_name = "CGROUP2_DIR")]
    apply: Option<PathBuf>,
}

fn parse_devnum(s: &str) -> Result<probe::iocost::DevNum, String> {
    s.parse()
}

pub fn probe_or_db(cmd: ProbeCmd) -> ExitCode {
    match cmd.db {
        Some(DbCmd::Db { action }) => db(action),
        None => probe(cmd.args),
    }
}

fn db(action: DbAction) -> ExitCode {
    let r = match action {
        DbAction::Add { db, results } => results.iter().try_for_each(|r| {
            for path in probe::db::add(&db, r)? {
                println!("added {}", path.display());
            }
            Ok(())
        }),
        DbAction::Merge { db } => probe::db::merge(&db).map(|merged| {
            for m in merged {
                let spread = m
                    .spread
                    .iter()
                    .map(|(k, v)| format!("{k} {:.1}%", 100.0 * v));
                let spread = spread.collect::<Vec<_>>().join(", ");
                println!(
                    "{} / {}: {} runs merged; spread: {spread}",
                    m.model, m.firmware, m.runs
                );
            }
        }),
        DbAction::Show { db } => probe::db::show(&db).map(|t| print!("{t}")),
        DbAction::Import { db, files } => files.iter().try_for_each(|f| {
            for path in probe::db::import(&db, f)? {
                println!("imported {}", path.display());
            }
            Ok(())
        }),
        DbAction::Export { db } => probe::db::export(&db).map(|t| print!("{t}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_with("probe db", e),
    }
}

fn probe(args: ProbeArgs) -> ExitCode {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let opts = probe::Options {
        targets: args.targets,
        config: args.config,
        spec: args.spec,
        out: args.out.clone(),
        destructive: args.destructive,
        quick: args.quick,
        max_qd: args.max_qd.clamp(1, 512),
        threads: args.threads.unwrap_or(cpus.min(8)).max(1),
        rounds: args.rounds.unwrap_or(0),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        devnum: args.kernel.devnum,
    };
    match probe::probe(&opts) {
        Ok(r) => {
            for d in &r.devices {
                println!("{}", probe::report::summary(d));
            }
            println!("report: {}", args.out.join("report.md").display());
            match &args.kernel.apply {
                Some(dir) => {
                    let lines: Vec<_> = r
                        .devices
                        .iter()
                        .map(|d| probe::cgroup::Line::Model(probe::model_line(d)))
                        .collect();
                    applied("probe --apply", probe::cgroup::apply(dir, &lines))
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => exit_with("probe", e),
    }
}

/// Prints a sweep's solutions and, with `apply`, writes its cost model and
/// `solution`'s QoS into that cgroup2 root.
fn tuned(
    r: &probe::tune::TuneResult,
    out: &std::path::Path,
    apply: Option<&std::path::Path>,
    solution: &str,
) -> ExitCode {
    for s in &r.solutions {
        println!(
            "{}",
            probe::tune::qos_snippet(&probe::report::slug(&r.device), s)
        );
        println!("io.cost.qos: {}\n", probe::tune_report::kernel_qos(r, s));
    }
    println!("report: {}", out.join("report.md").display());
    let Some(dir) = apply else {
        return ExitCode::SUCCESS;
    };
    let done = probe::tune_report::kernel_lines(r, solution)
        .and_then(|lines| probe::cgroup::apply(dir, &lines));
    applied("tune --apply", done)
}

/// Says what `--apply` wrote, or why it wrote nothing (exit status 1).
fn applied(what: &str, done: Result<Vec<String>, String>) -> ExitCode {
    match done {
        Ok(done) => {
            for d in done {
                println!("applied {d}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => exit_with(what, probe::ProbeError::Run(e)),
    }
}

fn exit_with(what: &str, e: probe::ProbeError) -> ExitCode {
    eprintln!("iopace {what}: {e}");
    match e {
        probe::ProbeError::Usage(_) => ExitCode::from(2),
        probe::ProbeError::Run(_) => ExitCode::FAILURE,
    }
}

#[derive(Args)]
pub struct TuneArgs {
    /// The device: a block device or file, or a bdev name of --config.
    #[arg(value_name = "BDEV-or-PATH")]
    target: String,
    /// An iopace config: its bdevs may be named; its [cost.NAME] or cost_db
    /// gives the cost model (else the read cost points are measured first).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Time for the whole sweep, shared by its points: 10m, 90s, 2h.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    budget: std::time::Duration,
    /// Keep the points already saved in --out and run the rest.
    #[arg(long)]
    resume: bool,
    /// Output directory for report.md, result.json, tune.png and points/.
    #[arg(long, value_name = "DIR", default_value = "tune-out")]
    out: PathBuf,
    /// Short points, for model devices and tests.
    #[arg(long)]
    quick: bool,
    /// The isolation solution keeps the QD 1 probe's p99 within this factor of its solo p99.
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    isolation_factor: f64,
    /// Measure through `iopace serve` of --config (its server settings,
    /// bdevs and pacing) and fio's nbd engine, as `iopace bench` does,
    /// instead of in process: the probe's latency and the adversary's
    /// bandwidth then include the server and the client.
    #[arg(long, requires = "config")]
    served: bool,
    #[command(flatten)]
    kernel: KernelArgs,
    /// The solution whose io.cost.qos line is written (and applied).
    #[arg(long, value_name = "NAME", default_value = "isolation",
          value_parser = ["isolation", "bandwidth", "balanced"])]
    solution: String,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: use 90s, 10m or 2h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: use 90s, 10m or 2h")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{s}`: must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

pub fn tune(args: TuneArgs) -> ExitCode {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let opts = probe::Options {
        targets: vec![args.target],
        config: args.config,
        spec: None,
        out: args.out.clone(),
        destructive: Vec::new(),
        quick: args.quick,
        max_qd: 64,
        threads: 1,
        rounds: 0,
        command: command.clone(),
        devnum: args.kernel.devnum,
    };
    let mut tune = probe::tune::TuneOptions {
        out: args.out.clone(),
        budget: args.budget,
        resume: args.resume,
        quick: args.quick,
        isolation_factor: args.isolation_factor,
        command,
        served: None,
        line_dev: None,
        identity: None,
        kernel_solution: args.solution.clone(),
    };
    let mut run = || -> Result<probe::tune::TuneResult, probe::ProbeError> {
        let targets = probe::open_targets(&opts)?;
        let t = &targets[0];
        tune.line_dev = Some(t.line_dev.clone());
        tune.identity = Some(t.identity.clone());
        let (cost, from) = probe::run::cost_for_tune(&opts, t)?;
        eprintln!("iopace tune: cost model from {from}");
        if let (true, Some(config)) = (args.served, &opts.config) {
            let dir = args.out.join("served");
            tune.served = Some(probe::served::Served::for_tune(
                config,
                t,
                &dir,
                args.budget,
                probe::tune::MAX_POINTS as u32,
                args.quick,
            )?);
            // Each served run's `iopace serve` locks a file image: close it here.
            let name = t.name.clone();
            drop(targets);
            return probe::tune::tune_served(&name, cost, &tune);
        }
        probe::tune::tune(t, cost, &tune)
    };
    match run() {
        Ok(r) => tuned(&r, &args.out, args.kernel.apply.as_deref(), &args.solution),
        Err(e) => {
            if args.out.join("points").exists() {
                eprintln!("finished points are saved; add --resume to continue");
            }
            exit_with("tune", e)
        }
    }
}
