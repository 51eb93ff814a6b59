//! The fuzzers' cases on worker threads: one case a time per thread,
//! results in index order whatever order they finish in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a fuzzer (`--fuzz`, `--faults`) was asked to run.
#[derive(Debug, Clone, Default)]
pub struct Cases {
    pub seed: u64,
    pub count: u64,
    /// Only this case (a repro).
    pub index: Option<u64>,
    pub json: bool,
    /// Worker threads (default: the machine's cores).
    pub jobs: Option<usize>,
}

impl Cases {
    /// `run_case(seed, index)` for each case asked for, in index order.
    pub fn run<T: Send>(&self, run_case: impl Fn(u64, u64) -> T + Sync) -> Vec<T> {
        let indexes = indexes(self.count, self.index);
        run_indexed(&indexes, self.jobs, |i| run_case(self.seed, i))
    }
}

/// The cases to run: only `index` (a repro), or `0..count`.
pub fn indexes(count: u64, index: Option<u64>) -> Vec<u64> {
    match index {
        Some(i) => vec![i],
        None => (0..count).collect(),
    }
}

/// `run(index)` for every index, on `jobs` threads (default: one per
/// core), in index order.
pub fn run_indexed<T: Send>(
    indexes: &[u64],
    jobs: Option<usize>,
    run: impl Fn(u64) -> T + Sync,
) -> Vec<T> {
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&index) = indexes.get(k) else { break };
                let out = run(index);
                done.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((index, out));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, out)| out).collect()
}
