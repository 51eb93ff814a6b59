//! Found by `iopace sim --faults`: small buffer classes double from
//! `small_buffer_size` below `buffer_size`, each with the same bytes, so
//! one 8 KiB small buffer makes 16 and 32 KiB classes of none; an IO that
//! fitted one took its place in their queue and waited forever.

use pool::{Alloc, PoolConfig, SharedPool};

#[test]
fn an_io_whose_class_has_no_buffers_takes_a_large_one() {
    let pool = SharedPool::new(PoolConfig {
        num_small_buffers: 1,
        small_buffer_size: 8192,
        ..PoolConfig::large_only(2, 65536, 2)
    })
    .expect("pool");
    let mut bufs = pool.register_reactor(Box::new(|| {}));
    let ready = |a: Alloc| match a {
        Alloc::Ready(b) => b,
        Alloc::Queued => panic!("queued with buffers free"),
    };
    let mid = ready(bufs.alloc(20000, 1));
    assert_eq!((mid.len(), pool.size_of(mid[0])), (1, 65536));
    let small = ready(bufs.alloc(4096, 2));
    assert_eq!(pool.size_of(small[0]), 8192);
    bufs.free(&mid);
    bufs.free(&small);
    assert_eq!(pool.free_total(), u64::from(pool.total()));
}
