//! `iopace bench`: drives real initiators (fio's nbd engine, one `fio
//! --server` per host) against iopace or a peer server, over loopback, a
//! Unix socket or shaped network namespaces, and reports per-host and sweep tables,
//! JSON, CSV, plots and a markdown report.

pub mod check;
pub mod fio;
pub mod plot;
pub mod procs;
pub mod report;
pub mod result;
pub mod run;
mod sampler;
pub mod scenario;
pub mod table;
pub mod target_proc;
pub mod wire;

use std::path::PathBuf;

pub use run::{Options, Remote};
use tomlfile::ConfigError;

#[derive(Debug)]
pub enum BenchError {
    /// A scenario file is wrong: exit status 2.
    Config(ConfigError),
    /// Running failed (a tool, a process, the network): exit status 1.
    Run(String),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Config(e) => write!(f, "{e}"),
            BenchError::Run(e) => write!(f, "{e}"),
        }
    }
}

/// Runs every scenario in turn and writes the outputs into `opts.out`.
pub fn bench(
    paths: &[PathBuf],
    opts: &Options,
    command: String,
) -> Result<report::Report, BenchError> {
    let mut loaded = Vec::new();
    for p in paths {
        let mut l = scenario::Loaded::load(p).map_err(BenchError::Config)?;
        for (name, value) in &opts.vars {
            l.set_var(name, value).map_err(BenchError::Config)?;
        }
        if opts.quick {
            l.make_quick();
        }
        if let Some(r) = &opts.remote {
            l.make_remote(&r.hosts, &r.target_address);
        }
        loaded.push(l);
    }
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| BenchError::Run(format!("{}: {e}", opts.out.display())))?;
    procs::catch_interrupts();
    let total: usize = loaded
        .iter()
        .map(|l| l.scenario.runs(&l.scenario.points()).len())
        .sum();
    let bar = run::progress(total as u64);
    let mut tests = Vec::new();
    for l in &loaded {
        let runs = run::run_scenario(l, opts, &bar).map_err(BenchError::Run)?;
        let mut t = report::TestReport::new(l, runs);
        for w in t.plot(&opts.out) {
            run::say(&bar, &format!("warning: plot not written: {w}"));
        }
        run::say(&bar, &format!("\n{}: {}\n{}", t.name, t.title, t.table()));
        tests.push(t);
    }
    bar.finish_and_clear();
    let report = report::Report {
        command,
        machine: report::machine(),
        tests,
    };
    report.write(&opts.out).map_err(BenchError::Run)?;
    Ok(report)
}
