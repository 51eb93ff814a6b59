//! The pool's classes, caches, waiters and grants.

use super::*;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

fn pool(n: u32, cache: u32) -> Arc<SharedPool> {
    SharedPool::new(PoolConfig::large_only(n, 4096, cache)).expect("pool")
}

fn reactor(p: &Arc<SharedPool>) -> (ReactorBufs, Arc<AtomicU64>) {
    let woken = Arc::new(AtomicU64::new(0));
    let w = woken.clone();
    let r = p.register_reactor(Box::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));
    (r, woken)
}

fn ready(a: Alloc) -> Vec<BufId> {
    match a {
        Alloc::Ready(b) => b,
        Alloc::Queued => panic!("expected buffers"),
    }
}

#[test]
fn multi_buffer_request_is_all_or_nothing() {
    let p = pool(4, 0);
    let (mut r, _) = reactor(&p);
    let a = ready(r.alloc(3 * 4096, 1));
    assert_eq!(a.len(), 3);
    assert_eq!(r.alloc(2 * 4096, 2), Alloc::Queued);
    // One buffer left, but the queued request needs two: it holds none.
    assert_eq!(p.free_total(), 1);
    r.free(&a);
    let mut out = Vec::new();
    r.poll(&mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 2);
    assert_eq!(out[0].1.len(), 2);
    r.free(&out[0].1);
    assert_eq!(p.free_total(), 4);
}

#[test]
fn free_on_one_reactor_wakes_waiter_on_another() {
    let p = pool(2, 0);
    let (mut a, _) = reactor(&p);
    let (mut b, b_woken) = reactor(&p);
    let held = ready(a.alloc(2 * 4096, 1));
    assert_eq!(b.alloc(4096, 7), Alloc::Queued);
    assert_eq!(b_woken.load(Ordering::SeqCst), 0);
    a.free(&held);
    assert!(
        b_woken.load(Ordering::SeqCst) > 0,
        "waiter's reactor must be woken"
    );
    let mut out = Vec::new();
    b.poll(&mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 7);
    b.free(&out[0].1);
    assert_eq!(p.free_total(), 2);
}

#[test]
fn fifo_across_reactors_without_barging() {
    let p = pool(2, 0);
    let (mut a, _) = reactor(&p);
    let (mut b, _) = reactor(&p);
    let held = ready(a.alloc(2 * 4096, 1));
    assert_eq!(b.alloc(2 * 4096, 10), Alloc::Queued); // head needs 2
    a.free(&held[..1]);
    // One buffer free, but a later small request must not jump the queue.
    assert_eq!(a.alloc(4096, 11), Alloc::Queued);
    a.free(&held[1..]);
    let mut out = Vec::new();
    b.poll(&mut out);
    assert_eq!(out.len(), 1, "head served first");
    b.free(&out[0].1);
    out.clear();
    a.poll(&mut out);
    assert_eq!(out.len(), 1, "then the next");
    a.free(&out[0].1);
    assert_eq!(p.free_total(), 2);
}

#[test]
fn stranded_cache_is_drained_for_waiters() {
    let p = pool(4, 4);
    let (mut a, a_woken) = reactor(&p);
    let (mut b, _) = reactor(&p);
    let held = ready(a.alloc(4 * 4096, 1));
    a.free(&held); // all four now sit in a's cache
    assert_eq!(a.stats().cached, 4);
    assert_eq!(b.alloc(2 * 4096, 5), Alloc::Queued);
    assert!(
        a_woken.load(Ordering::SeqCst) > 0,
        "cache holder asked to drain"
    );
    let mut out = Vec::new();
    a.poll(&mut out); // a drains
    assert!(out.is_empty());
    b.poll(&mut out);
    assert_eq!(out.len(), 1);
    b.free(&out[0].1);
    b.poll(&mut Vec::new());
    assert_eq!(p.free_total(), 4);
}

#[test]
fn cancel_before_and_after_grant() {
    let p = pool(1, 0);
    let (mut a, _) = reactor(&p);
    let held = ready(a.alloc(4096, 1));
    assert_eq!(a.alloc(4096, 2), Alloc::Queued);
    a.cancel(2);
    assert_eq!(a.stats().queued, 0);
    assert_eq!(a.alloc(4096, 3), Alloc::Queued);
    a.free(&held); // granted to 3, not yet polled
    a.cancel(3);
    assert_eq!(p.free_total(), 1);
    let mut out = Vec::new();
    a.poll(&mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats().in_use, 0);
}

#[test]
fn buffers_are_distinct_and_aligned() {
    let p = pool(8, 2);
    let (mut a, _) = reactor(&p);
    let bufs = ready(a.alloc(8 * 4096, 1));
    let set: HashSet<_> = bufs.iter().collect();
    assert_eq!(set.len(), 8);
    for b in &bufs {
        assert_eq!(p.ptr(*b) as usize % 4096, 0);
        // The memory is writable.
        // SAFETY: the buffer is ours and 4096 bytes long.
        unsafe { p.ptr(*b).write_bytes(0xab, 4096) };
    }
    a.free(&bufs);
    assert_eq!(p.free_total(), 8);
}

fn two_classes(large: u32, small: u32) -> Arc<SharedPool> {
    SharedPool::new(PoolConfig {
        num_small_buffers: small,
        small_buffer_size: 8192,
        ..PoolConfig::large_only(large, 65536, 2)
    })
    .expect("pool")
}

#[test]
fn classes_double_from_the_small_size_below_the_large_one() {
    let cfg = PoolConfig {
        num_small_buffers: 4,
        small_buffer_size: 12288,
        ..PoolConfig::large_only(2, 131072, 0)
    };
    let sizes: Vec<(u32, u32)> = cfg.classes().iter().map(|c| (c.size, c.count)).collect();
    assert_eq!(
        sizes,
        vec![(12288, 4), (24576, 2), (49152, 1), (98304, 0), (131072, 2)]
    );
    let none = PoolConfig::large_only(2, 131072, 0);
    assert_eq!(none.classes().len(), 1);
}

#[test]
fn a_small_io_takes_one_small_buffer_and_a_large_one_pieces() {
    let p = two_classes(4, 8);
    let (mut a, _) = reactor(&p);
    let small = ready(a.alloc(4096, 1));
    let edge = ready(a.alloc(8192, 2));
    let mid = ready(a.alloc(20000, 4));
    let large = ready(a.alloc(65536 + 1, 3));
    assert_eq!(
        (small.len(), edge.len(), mid.len(), large.len()),
        (1, 1, 1, 2)
    );
    assert_eq!(p.size_of(small[0]), 8192);
    assert_eq!(p.size_of(mid[0]), 32768, "the smallest class it fits");
    assert_eq!(p.size_of(large[0]), 65536);
    assert_eq!(a.stats().in_use_bytes, 2 * 8192 + 32768 + 2 * 65536);
    // Every buffer is aligned, inside the mapping and apart from the rest.
    let mut spans: Vec<(usize, usize)> = [&small, &edge, &mid, &large]
        .iter()
        .flat_map(|b| b.iter())
        .map(|&b| (p.ptr(b) as usize, p.size_of(b) as usize))
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {spans:?}");
    }
    for &(at, len) in &spans {
        assert_eq!(at % 4096, 0);
        // SAFETY: the buffer is ours and `len` bytes long.
        unsafe { (at as *mut u8).write_bytes(0x5a, len) };
    }
    for b in [small, edge, mid, large] {
        a.free(&b);
    }
    assert_eq!(a.stats().in_use_bytes, 0);
    // 4 large, and 64 KiB in each of the 8, 16 and 32 KiB classes.
    assert_eq!(p.free_total(), 4 + 8 + 4 + 2);
    assert_eq!(u64::from(p.total()), p.free_total());
}

#[test]
fn each_class_queues_and_serves_its_own_waiters() {
    let p = two_classes(1, 1);
    let (mut a, _) = reactor(&p);
    let (mut b, _) = reactor(&p);
    let small = ready(a.alloc(4096, 1));
    let large = ready(a.alloc(65536, 2));
    assert_eq!(b.alloc(4096, 3), Alloc::Queued);
    assert_eq!(b.alloc(65536, 4), Alloc::Queued);
    a.free(&small);
    let mut out = Vec::new();
    b.poll(&mut out);
    assert_eq!(
        out.iter().map(|g| g.0).collect::<Vec<_>>(),
        vec![3],
        "a small free serves the small waiter"
    );
    assert_eq!(p.size_of(out[0].1[0]), 8192);
    b.cancel(4);
    assert_eq!(b.stats().queued, 0);
    b.free(&out[0].1);
    a.free(&large);
    a.poll(&mut Vec::new());
    b.poll(&mut Vec::new());
    assert_eq!(p.free_total(), 2);
}

// Found by `iopace sim --faults`: small buffer classes double from
// `small_buffer_size` below `buffer_size`, each with the same bytes, so
// one 8 KiB small buffer makes 16 and 32 KiB classes of none; an IO that
// fitted one took its place in their queue and waited forever.
#[test]
fn an_io_whose_class_has_no_buffers_takes_a_large_one() {
    let pool = SharedPool::new(PoolConfig {
        num_small_buffers: 1,
        small_buffer_size: 8192,
        ..PoolConfig::large_only(2, 65536, 2)
    })
    .expect("pool");
    let mut bufs = pool.register_reactor(Box::new(|| {}));
    let mid = ready(bufs.alloc(20000, 1));
    assert_eq!((mid.len(), pool.size_of(mid[0])), (1, 65536));
    let small = ready(bufs.alloc(4096, 2));
    assert_eq!(pool.size_of(small[0]), 8192);
    bufs.free(&mid);
    bufs.free(&small);
    assert_eq!(pool.free_total(), u64::from(pool.total()));
}
