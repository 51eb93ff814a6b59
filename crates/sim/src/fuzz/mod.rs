//! `iopace sim --fuzz SEED --count N`: random scenarios ([`gen`]), each
//! run under `auto` and scored against the fairness oracle ([`score`]);
//! a share are broken on purpose and must be rejected ([`invalid`]).

pub mod gen;
pub mod invalid;
pub mod score;

use std::path::PathBuf;

use pace::pacer::Mode;
use rand::Rng;
use serde::Serialize;

use crate::parse;
pub use gen::Variant;
use score::{Miss, Score};

/// One case in fifty is broken on purpose.
const BROKEN_EVERY: u64 = 50;

/// What `iopace sim --fuzz` was asked for.
#[derive(Debug, Clone, Default)]
pub struct FuzzArgs {
    pub cases: crate::jobs::Cases,
    /// Where each failing case's scenario file is written.
    pub out: Option<PathBuf>,
    /// The pacing mode each case runs under (`auto` for the goals; another
    /// mode shows which misses are the pacer's and which the engine's or
    /// the hardware's), and the factor on its QD.
    pub variant: Variant,
}

/// One case's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    pub seed: u64,
    pub index: u64,
    /// The pacing mode it ran under.
    pub mode: &'static str,
    /// The factor on its QD (1: the case as drawn).
    pub qd_scale: u32,
    pub pass: bool,
    /// A broken scenario the loader had to reject.
    pub broken: bool,
    #[serde(flatten)]
    pub score: Option<Score>,
    /// What the loader said wrongly, for a broken case.
    pub error: Option<String>,
    /// What kind of scenario it is, for sorting failures into classes.
    pub features: Option<Features>,
    /// Wall-clock time the case took, ms.
    pub elapsed_ms: u64,
    #[serde(skip)]
    pub text: String,
}

/// Runs case `index` of `seed` under `auto`.
pub fn run_case(seed: u64, index: u64) -> Case {
    run_case_in(seed, index, Mode::Auto)
}

/// Runs case `index` of `seed` under `mode`.
pub fn run_case_in(seed: u64, index: u64, mode: Mode) -> Case {
    run_case_as(seed, index, Variant { mode, qd_scale: 1 })
}

/// Runs case `index` of `seed` as `variant` says.
pub fn run_case_as(seed: u64, index: u64, variant: Variant) -> Case {
    let text = gen::case_as(seed, index, variant);
    let source = format!("fuzz-{seed}-{index}.toml");
    let mut case = Case {
        seed,
        index,
        mode: variant.mode.name(),
        qd_scale: variant.qd_scale,
        pass: false,
        broken: false,
        score: None,
        error: None,
        features: None,
        elapsed_ms: 0,
        text: text.clone(),
    };
    let started = std::time::Instant::now();
    if index % BROKEN_EVERY == BROKEN_EVERY - 1 {
        let mut r = gen::rng(seed, index);
        let _: u64 = r.gen();
        let (bad, field) = invalid::break_case(&mut r, &text);
        case.broken = true;
        case.error = invalid::rejected_well(&bad, &source, field).err();
        case.pass = case.error.is_none();
        case.text = bad;
        return case;
    }
    match parse(&text, &source) {
        Ok(sc) => {
            let s = score::score(&sc);
            case.pass = s.misses.is_empty();
            case.score = Some(s);
            case.features = Some(Features::of(&sc));
        }
        Err(e) => case.error = Some(format!("a generated scenario did not load: {e}")),
    }
    case.elapsed_ms = started.elapsed().as_millis() as u64;
    case
}

/// A scenario's shape in a few numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Features {
    pub hosts: usize,
    pub tenants: usize,
    pub reactors: usize,
    pub ports: usize,
    pub qd: u32,
    pub writes: bool,
    pub max_io: u32,
    pub cost_unknown: bool,
    pub slow_links: bool,
    pub qd1_tenant: bool,
    pub port_step: bool,
}

impl Features {
    fn of(sc: &crate::Scenario) -> Features {
        let run = &sc.runs[0];
        Features {
            hosts: sc.hosts.iter().map(|g| g.count).sum(),
            tenants: run.pacing.tenants.len(),
            reactors: run.reactors.unwrap_or(sc.target.reactors),
            ports: sc.ports.len(),
            qd: sc.qds[0],
            writes: sc.hosts.iter().any(|g| g.read_pct < 100),
            max_io: sc
                .hosts
                .iter()
                .flat_map(|g| g.bssplit.iter().map(|b| b.0))
                .max()
                .unwrap_or(0),
            cost_unknown: sc.devices.iter().any(|d| !d.cost_known),
            slow_links: sc.hosts.iter().any(|g| g.link_gbps.is_some()),
            qd1_tenant: sc.hosts.iter().any(|g| g.fixed_qd == Some(1)),
            port_step: sc.ports.iter().any(|p| p.step.is_some()),
        }
    }
}

/// Runs every case on `jobs` threads, in index order in the result.
pub fn run_cases(args: &FuzzArgs) -> Vec<Case> {
    args.cases
        .run(|seed, index| run_case_as(seed, index, args.variant))
}

/// `iopace sim --fuzz`: prints the report (or JSON) and writes failing
/// cases' scenarios; exit status 1 when any case fails.
pub fn fuzz(args: &FuzzArgs) -> i32 {
    let cases = run_cases(args);
    if let Some(dir) = &args.out {
        if let Err(e) = write_failures(dir, &cases) {
            eprintln!("iopace sim --fuzz: {}: {e}", dir.display());
            return 2;
        }
    }
    if args.cases.json {
        match serde_json::to_string_pretty(&cases) {
            Ok(j) => println!("{j}"),
            Err(e) => eprintln!("iopace sim --fuzz: {e}"),
        }
    } else {
        print!("{}", report(&cases, args.out.is_some()));
    }
    i32::from(cases.iter().any(|c| !c.pass))
}

fn write_failures(dir: &std::path::Path, cases: &[Case]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for c in cases.iter().filter(|c| !c.pass) {
        let name = format!("fuzz-{}-{}.toml", c.seed, c.index);
        std::fs::write(dir.join(name), &c.text)?;
    }
    Ok(())
}

/// Worst cases shown in the report.
const WORST: usize = 20;

/// The pass rate, the misses by goal, and the worst cases with repros.
pub fn report(cases: &[Case], wrote: bool) -> String {
    // The pass rate is of the valid cases: a broken one passes by being
    // rejected, and counted in, it read as two more scenarios held.
    let valid: Vec<&Case> = cases.iter().filter(|c| !c.broken).collect();
    let pass = valid.iter().filter(|c| c.pass).count();
    let broken = cases.len() - valid.len();
    let rejected = cases.iter().filter(|c| c.broken && c.pass).count();
    let mode = cases.first().map_or("auto", |c| c.mode);
    let mut s = format!(
        "fuzz: {} cases under `{mode}`: {pass} of {} valid cases pass ({:.1}%); \
         {rejected} of {broken} broken on purpose rejected well\n\n\
         | goal | cases missing it |\n|---|---|\n",
        cases.len(),
        valid.len(),
        100.0 * pass as f64 / valid.len().max(1) as f64
    );
    for goal in [
        "host share",
        "total",
        "buffers",
        "tenant ratio",
        "QD 1 p99",
        "books",
    ] {
        let n = cases
            .iter()
            .filter(|c| {
                c.score
                    .as_ref()
                    .is_some_and(|s| s.misses.iter().any(|m| m.goal() == goal))
            })
            .count();
        s += &format!("| {goal} | {n} |\n");
    }
    let bad_loads = cases.iter().filter(|c| c.error.is_some()).count();
    s += &format!("| loader (broken cases misjudged) | {bad_loads} |\n\n");
    let mut failing: Vec<&Case> = cases.iter().filter(|c| !c.pass).collect();
    failing.sort_by(|a, b| worst(a).total_cmp(&worst(b)));
    if !failing.is_empty() {
        s += "| case | worst host % | total % | bufs / floor MiB | misses | repro |\n|---|---|---|---|---|---|\n";
    }
    for c in failing.iter().take(WORST) {
        s += &line(c, wrote);
    }
    s
}

fn worst(c: &Case) -> f64 {
    c.score.as_ref().map_or(-1.0, |s| s.worst_host_pct)
}

fn line(c: &Case, wrote: bool) -> String {
    let ablated = pace::pacer::ablate::taken_out();
    let ablate = match ablated.is_empty() {
        true => String::new(),
        false => format!(" --ablate {}", ablated.join(",")),
    };
    let repro = match wrote {
        true => format!("`iopace sim fuzz-{}-{}.toml{ablate}`", c.seed, c.index),
        false if c.mode == "auto" => {
            format!("`iopace sim --fuzz {} --index {}{ablate}`", c.seed, c.index)
        }
        false => format!(
            "`iopace sim --fuzz {} --index {} --mode {}{ablate}`",
            c.seed, c.index, c.mode
        ),
    };
    let Some(s) = &c.score else {
        return format!(
            "| {}:{} | | | | {} | {repro} |\n",
            c.seed,
            c.index,
            c.error.as_deref().unwrap_or("")
        );
    };
    let misses: Vec<String> = summarize(&s.misses);
    format!(
        "| {}:{} | {:.0} | {:.0} | {:.1} / {:.1} | {} | {repro} |\n",
        c.seed,
        c.index,
        s.worst_host_pct,
        s.total_pct,
        s.bufs_mib,
        s.floor_mib,
        misses.join("; ")
    )
}

/// The misses in a few words: counts of host misses, the others in full.
fn summarize(misses: &[Miss]) -> Vec<String> {
    let hosts = misses
        .iter()
        .filter(|m| matches!(m, Miss::HostShare { .. }))
        .count();
    let mut out = Vec::new();
    if hosts > 0 {
        out.push(format!("{hosts} hosts under share"));
    }
    for m in misses {
        match m {
            Miss::HostShare { .. } => {}
            Miss::Total {
                ideal_gbps,
                got_gbps,
            } => out.push(format!("total {got_gbps:.1} of {ideal_gbps:.1} Gb/s")),
            Miss::Buffers {
                mean_mib,
                floor_mib,
            } => out.push(format!("bufs {mean_mib:.1} MiB, floor {floor_mib:.1}")),
            Miss::TenantRatio {
                tenant,
                ideal_share,
                got_share,
            } => out.push(format!(
                "tenant {tenant} {:.0}% of bytes, ideal {:.0}%",
                got_share * 100.0,
                ideal_share * 100.0
            )),
            Miss::Qd1Latency {
                p99_us,
                solo_p99_us,
                floor_us,
                ..
            } => out.push(format!(
                "QD 1 p99 {p99_us:.0} us, solo {solo_p99_us:.0}, floor {floor_us:.0}"
            )),
            Miss::Books => out.push("books broken".into()),
        }
    }
    out
}

#[cfg(test)]
mod tests;
