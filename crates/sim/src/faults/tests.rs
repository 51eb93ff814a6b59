//! The fault fuzzer in CI: a fixed set of cases, every one passing, over
//! at least a million injected faults.

use super::*;

#[test]
fn a_case_is_the_same_every_time() {
    let (a, _) = gen::case(5, 3);
    let (b, _) = gen::case(5, 3);
    assert_eq!(a, b);
    let one = run_case(5, 3);
    let two = run_case(5, 3);
    assert_eq!(one.counts.events, two.counts.events);
    assert_eq!(one.counts.faults(), two.counts.faults());
}

/// Every generated case loads.
#[test]
fn every_generated_case_loads() {
    for index in 0..200 {
        let (text, _) = gen::case(9, index);
        if let Err(e) = parse(&text, "case.toml") {
            panic!("case {index}: {e}\n{text}");
        }
    }
}

/// Cases of seed 1 that CI runs: about 1.1 million faults, half a minute
/// on two cores in a debug build.
const CI_SEED: u64 = 1;
const CI_CASES: u64 = 260;

#[test]
fn a_million_faults_break_no_book_and_hang_no_io() {
    let args = FaultArgs {
        seed: CI_SEED,
        count: CI_CASES,
        jobs: Some(2),
        ..FaultArgs::default()
    };
    let cases = run_cases(&args);
    let failed: Vec<String> = cases
        .iter()
        .filter(|c| !c.pass)
        .map(|c| format!("{}: {}", c.repro(), c.failure.as_deref().unwrap_or("")))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let faults: u64 = cases.iter().map(|c| c.counts.faults()).sum();
    println!("{}", report(&cases));
    assert!(faults >= 1_000_000, "only {faults} faults injected");
}
