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
    /// Add every device of a probe's result.json as one run.
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
    /// Short points (20 ms windows, 0.4 s cap) and QD up to 64.
    #[arg(long)]
    quick: bool,
    /// Highest queue depth of the curves.
    #[arg(long, value_name = "QD", default_value_t = 256)]
    max_qd: u32,
    /// Most worker threads in the scaling runs (default: CPUs, at most 8).
    #[arg(long, value_name = "N")]
    threads: Option<u32>,
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
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    match probe::probe(&opts) {
        Ok(r) => {
            for d in &r.devices {
                println!("{}", probe::report_summary(d));
            }
            println!("report: {}", args.out.join("report.md").display());
            ExitCode::SUCCESS
        }
        Err(e) => exit_with("probe", e),
    }
}

fn exit_with(what: &str, e: probe::ProbeError) -> ExitCode {
    eprintln!("iopace {what}: {e}");
    match e {
        probe::ProbeError::Usage(_) => ExitCode::from(2),
        probe::ProbeError::Run(_) => ExitCode::FAILURE,
    }
}
