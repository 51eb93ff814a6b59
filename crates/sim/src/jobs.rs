//! The fuzzers' cases on worker threads: one case a time per thread,
//! results in index order whatever order they finish in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
