//! The data buffer pool: one shared pool with per-reactor caches, as SPDK
//! has, where a waiter is served in turn and idle caches drain back. The
//! policy (who gets which buffers, who waits, when caches drain) is
//! [`PoolPolicy`], sans-IO and shared with the simulator; this module is its
//! threaded driver:
//!
//! - The fast path (cache hit, cache free, nobody waiting) takes no lock.
//! - Everything else runs the policy under one mutex. A waiter served by a
//!   free on another reactor gets its buffers as a grant, and its reactor is
//!   woken through its waker; so is a reactor asked to drain its cache.
//!
//! Buffers come in size classes, as SPDK's iobuf has a small and a large
//! pool: sizes double from `small_buffer_size` while below `buffer_size`,
//! and an IO takes one buffer of the smallest class it fits, or
//! `buffer_size` pieces. A 4 KiB IO that held a 128 KiB buffer made the
//! memory in flight 32 times its data; now any IO holds at most twice its
//! size. Each class is its own policy (free list, FIFO of waiters, caches);
//! ids are global, large ones first.

mod policy;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use policy::{BufCache, PoolEvent, PoolPolicy};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    pub num_shared_buffers: u32,
    pub buffer_size: u32,
    pub buf_cache_size: u32,
    /// Small buffers: `num_small_buffers x small_buffer_size` bytes for each
    /// class below `buffer_size` (0: none, every IO takes `buffer_size`
    /// pieces).
    pub num_small_buffers: u32,
    pub small_buffer_size: u32,
}

/// One size class: its buffers' size, their ids `first..first + count`,
/// and where its memory starts in the pool's mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Class {
    size: u32,
    first: u32,
    count: u32,
    offset: usize,
}

impl PoolConfig {
    /// Large buffers only, as the seed's pool had.
    pub fn large_only(
        num_shared_buffers: u32,
        buffer_size: u32,
        buf_cache_size: u32,
    ) -> PoolConfig {
        PoolConfig {
            num_shared_buffers,
            buffer_size,
            buf_cache_size,
            num_small_buffers: 0,
            small_buffer_size: 0,
        }
    }

    /// The size classes, smallest first, the large buffers last (ids from
    /// 0, memory from the start); each small class has the same bytes.
    fn classes(&self) -> Vec<Class> {
        let large = Class {
            size: self.buffer_size,
            first: 0,
            count: self.num_shared_buffers,
            offset: 0,
        };
        let mut classes = Vec::new();
        let budget = u64::from(self.num_small_buffers) * u64::from(self.small_buffer_size);
        let (mut first, mut offset) = (large.count, large.count as usize * large.size as usize);
        let mut size = self.small_buffer_size;
        while budget > 0 && size > 0 && size < self.buffer_size {
            let count = (budget / u64::from(size)) as u32;
            classes.push(Class {
                size,
                first,
                count,
                offset,
            });
            (first, offset) = (first + count, offset + count as usize * size as usize);
            size = size.saturating_mul(2);
        }
        classes.push(large);
        classes
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// Result of [`ReactorBufs::alloc`].
#[derive(Debug, PartialEq, Eq)]
pub enum Alloc {
    /// The caller owns these buffers now.
    Ready(Vec<BufId>),
    /// Queued; the buffers arrive through [`ReactorBufs::poll`].
    Queued,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers held by this reactor's requests.
    pub in_use: u64,
    /// Their bytes (small and large buffers).
    pub in_use_bytes: u64,
    /// Buffers parked in this reactor's caches.
    pub cached: u64,
    /// Requests of this reactor that had to queue.
    pub waits: u64,
    /// Requests of this reactor queued now.
    pub queued: u64,
}

type Waker = Box<dyn Fn() + Send + Sync>;

/// What other threads may touch of one reactor.
struct ReactorShared {
    waker: Waker,
    grants: Mutex<Vec<(u64, Vec<BufId>)>>,
    has_grants: AtomicBool,
    drain_cache: AtomicBool,
    /// Per size class.
    cached: Vec<AtomicU32>,
    granted_pending: AtomicU32,
}

impl ReactorShared {
    fn grants(&self) -> MutexGuard<'_, Vec<(u64, Vec<BufId>)>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Inner {
    /// Per size class.
    policies: Vec<PoolPolicy>,
    reactors: Vec<Arc<ReactorShared>>,
}

impl Inner {
    /// Runs `op` on size class `class`'s policy, with each reactor's cache
    /// as its atomics say, then hands out what it decided. Returns the
    /// reactors to wake (woken after the lock is dropped).
    fn run<T>(
        &mut self,
        class: usize,
        waiting: &AtomicUsize,
        op: impl FnOnce(&mut PoolPolicy, &dyn Fn(usize) -> bool, &mut Vec<PoolEvent>) -> T,
    ) -> (T, Vec<Arc<ReactorShared>>) {
        let mut events = Vec::new();
        let reactors = &self.reactors;
        let cached = |r: usize| reactors[r].cached[class].load(Ordering::Acquire) > 0;
        let result = op(&mut self.policies[class], &cached, &mut events);
        let queued = self.policies.iter().map(PoolPolicy::waiting).sum();
        waiting.store(queued, Ordering::Release);
        let mut wake = Vec::new();
        for event in events {
            match event {
                PoolEvent::Grant {
                    reactor,
                    token,
                    bufs,
                } => {
                    let r = self.reactors[reactor].clone();
                    r.granted_pending
                        .fetch_add(bufs.len() as u32, Ordering::AcqRel);
                    r.grants().push((token, bufs));
                    r.has_grants.store(true, Ordering::Release);
                    wake.push(r);
                }
                PoolEvent::Drain { reactor } => {
                    let r = &self.reactors[reactor];
                    if !r.drain_cache.swap(true, Ordering::AcqRel) {
                        wake.push(r.clone());
                    }
                }
            }
        }
        (result, wake)
    }
}

fn wake_all(wake: Vec<Arc<ReactorShared>>) {
    for r in wake {
        (r.waker)();
    }
}

pub struct SharedPool {
    base: *mut u8,
    map_len: usize,
    cfg: PoolConfig,
    classes: Vec<Class>,
    inner: Mutex<Inner>,
    /// Requests queued across all reactors; read on every free without a lock.
    waiting: AtomicUsize,
}

// SAFETY: `base` is an mmap owned by the pool; buffers are handed out
// exclusively (one owner at a time), so sharing the pointer is sound.
unsafe impl Send for SharedPool {}
// SAFETY: as above; all mutable state is behind the mutex or atomics.
unsafe impl Sync for SharedPool {}

impl Drop for SharedPool {
    fn drop(&mut self) {
        // SAFETY: unmapping the region mapped in `new`; no buffer outlives the pool.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

impl SharedPool {
    pub fn new(cfg: PoolConfig) -> io::Result<Arc<SharedPool>> {
        if cfg.buffer_size == 0
            || !cfg.buffer_size.is_multiple_of(4096)
            || cfg.num_shared_buffers == 0
        {
            return Err(invalid(
                "buffer_size must be a non-zero multiple of 4096 and num_shared_buffers at least 1",
            ));
        }
        if cfg.num_small_buffers > 0
            && (cfg.small_buffer_size == 0
                || !cfg.small_buffer_size.is_multiple_of(4096)
                || cfg.small_buffer_size >= cfg.buffer_size)
        {
            return Err(invalid(
                "small_buffer_size must be a non-zero multiple of 4096 below buffer_size",
            ));
        }
        let classes = cfg.classes();
        let map_len = classes
            .iter()
            .map(|c| c.offset + c.count as usize * c.size as usize)
            .max()
            .unwrap_or(0);
        // SAFETY: anonymous private mapping; checked for failure below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let policies = classes
            .iter()
            .map(|c| PoolPolicy::with_ids(c.first, c.count, cfg.buf_cache_size))
            .collect();
        Ok(Arc::new(SharedPool {
            base: base.cast(),
            map_len,
            cfg,
            classes,
            inner: Mutex::new(Inner {
                policies,
                reactors: Vec::new(),
            }),
            waiting: AtomicUsize::new(0),
        }))
    }

    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    /// The large buffers' size: the piece a large IO is served in.
    pub fn buffer_size(&self) -> u32 {
        self.cfg.buffer_size
    }

    /// Large buffers: what a connection's and a stream's share is counted in.
    pub fn large_buffers(&self) -> u32 {
        self.cfg.num_shared_buffers
    }

    /// Bytes of the pool's one mapping, every class's buffers.
    pub fn map_len(&self) -> usize {
        self.map_len
    }

    /// Buffers of every class.
    pub fn total(&self) -> u32 {
        self.classes.iter().map(|c| c.count).sum()
    }

    /// The size class of buffer `id` (an index into `classes`).
    fn class(&self, id: BufId) -> usize {
        let found = self
            .classes
            .iter()
            .position(|c| (c.first..c.first + c.count).contains(&id.0));
        debug_assert!(found.is_some(), "buffer {id:?} is in no class");
        found.unwrap_or(self.classes.len() - 1)
    }

    /// How many bytes buffer `id` holds.
    pub fn size_of(&self, id: BufId) -> u32 {
        self.classes[self.class(id)].size
    }

    /// Start of buffer `id`: 4 KiB aligned, `size_of(id)` bytes, stable for the pool's life.
    pub fn ptr(&self, id: BufId) -> *mut u8 {
        debug_assert!(id.0 < self.total());
        let c = &self.classes[self.class(id)];
        let offset = c.offset + (id.0 - c.first) as usize * c.size as usize;
        // SAFETY: an id of a class keeps the offset inside the mapping.
        unsafe { self.base.add(offset) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every
        // critical section only moves ids), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn register_reactor(self: &Arc<Self>, waker: Box<dyn Fn() + Send + Sync>) -> ReactorBufs {
        let me = Arc::new(ReactorShared {
            waker,
            grants: Mutex::new(Vec::new()),
            has_grants: AtomicBool::new(false),
            drain_cache: AtomicBool::new(false),
            cached: self.classes.iter().map(|_| AtomicU32::new(0)).collect(),
            granted_pending: AtomicU32::new(0),
        });
        let (id, caches): (usize, Vec<BufCache>) = {
            let mut inner = self.lock();
            inner.reactors.push(me.clone());
            let added: Vec<_> = inner
                .policies
                .iter_mut()
                .map(PoolPolicy::add_reactor)
                .collect();
            (
                added[0].0,
                added.into_iter().map(|(_, cache)| cache).collect(),
            )
        };
        ReactorBufs {
            id,
            pool: self.clone(),
            me,
            in_use: vec![0; caches.len()],
            caches,
            waits: 0,
            queued: 0,
        }
    }

    /// Buffers not held by any request: shared, cached and granted-not-yet-polled.
    /// Equals `total()` when the target is quiescent.
    pub fn free_total(&self) -> u64 {
        let inner = self.lock();
        let mut n: u64 = inner.policies.iter().map(|p| p.free_len() as u64).sum();
        for r in &inner.reactors {
            n += r
                .cached
                .iter()
                .map(|c| u64::from(c.load(Ordering::Acquire)))
                .sum::<u64>();
            n += u64::from(r.granted_pending.load(Ordering::Acquire));
        }
        n
    }

    /// Returns buffers of one class to its shared list and serves waiters.
    fn give_back(&self, class: usize, bufs: Vec<BufId>) {
        let ((), wake) = self.lock().run(class, &self.waiting, |p, cached, out| {
            p.give_back(bufs, cached, out)
        });
        wake_all(wake);
    }

    fn nobody_waits(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }
}

/// One reactor's view of the pool: its caches and its queued requests.
/// Owned by the reactor thread.
pub struct ReactorBufs {
    id: usize,
    pool: Arc<SharedPool>,
    me: Arc<ReactorShared>,
    /// Per size class.
    caches: Vec<BufCache>,
    in_use: Vec<u64>,
    waits: u64,
    queued: u64,
}

impl ReactorBufs {
    pub fn pool(&self) -> &Arc<SharedPool> {
        &self.pool
    }

    /// Large buffers for `len` bytes: how many pieces a request that long
    /// is served in.
    pub fn buffers_for(&self, len: u32) -> u32 {
        len.div_ceil(self.pool.cfg.buffer_size)
    }

    /// The class and count of buffers `len` bytes take: one of the
    /// smallest class it fits that has buffers, or large pieces. (A small
    /// class too big for its share of the small buffers' bytes has none:
    /// an IO queued there would wait forever.)
    fn class_for(&self, len: u32) -> (usize, u32) {
        let classes = &self.pool.classes;
        let large = classes.len() - 1;
        match classes[..large]
            .iter()
            .position(|c| len <= c.size && c.count > 0)
        {
            Some(class) => (class, 1),
            None => (large, self.buffers_for(len)),
        }
    }

    fn set_cached(&self, class: usize) {
        self.me.cached[class].store(self.caches[class].len() as u32, Ordering::Release);
    }

    /// Buffers for `len` bytes: from the cache, then the shared pool, else
    /// `token` is queued FIFO and its buffers arrive through [`Self::poll`].
    pub fn alloc(&mut self, len: u32, token: u64) -> Alloc {
        let (class, n) = self.class_for(len);
        if n == 0 {
            return Alloc::Ready(Vec::new());
        }
        if let Some(bufs) = self.caches[class].take(n as usize, self.pool.nobody_waits()) {
            self.set_cached(class);
            self.in_use[class] += u64::from(n);
            return Alloc::Ready(bufs);
        }
        let (id, cache) = (self.id, &mut self.caches[class]);
        // This reactor's cache is pooled first, so it is empty while the
        // policy looks at who caches (its own atomic is stale until below).
        let (ready, wake) = self
            .pool
            .lock()
            .run(class, &self.pool.waiting, |p, cached, out| {
                p.alloc(cache, id, n, token, |r| r != id && cached(r), out)
            });
        self.set_cached(class);
        wake_all(wake);
        match ready {
            Some(bufs) => {
                self.in_use[class] += u64::from(n);
                Alloc::Ready(bufs)
            }
            None => {
                self.waits += 1;
                self.queued += 1;
                Alloc::Queued
            }
        }
    }

    /// Returns a request's buffers (one class): to the cache while nobody
    /// waits, else to the waiters.
    pub fn free(&mut self, bufs: &[BufId]) {
        let Some(&first) = bufs.first() else {
            return;
        };
        let class = self.pool.class(first);
        debug_assert!(
            bufs.iter().all(|&b| self.pool.class(b) == class),
            "one class per request"
        );
        debug_assert!(
            self.in_use[class] >= bufs.len() as u64,
            "freeing buffers not held"
        );
        self.in_use[class] -= bufs.len() as u64;
        let rest = self.caches[class].keep(bufs, self.pool.nobody_waits());
        self.set_cached(class);
        if !rest.is_empty() {
            self.pool.give_back(class, rest.to_vec());
        }
    }

    /// Collects grants for this reactor's queued requests into `out`, and
    /// drains the caches when waiters need it. Cheap when nothing happened.
    pub fn poll(&mut self, out: &mut Vec<(u64, Vec<BufId>)>) {
        let asked = self.me.drain_cache.swap(false, Ordering::AcqRel);
        for class in 0..self.caches.len() {
            if self.caches[class].must_drain(asked, !self.pool.nobody_waits()) {
                let cache = self.caches[class].drain();
                self.set_cached(class);
                self.pool.give_back(class, cache);
            }
        }
        if self.me.has_grants.swap(false, Ordering::AcqRel) {
            let grants = std::mem::take(&mut *self.me.grants());
            for (token, bufs) in grants {
                let pending = self
                    .me
                    .granted_pending
                    .fetch_sub(bufs.len() as u32, Ordering::AcqRel);
                debug_assert!(pending >= bufs.len() as u32, "grants polled twice");
                if let Some(&b) = bufs.first() {
                    self.in_use[self.pool.class(b)] += bufs.len() as u64;
                }
                debug_assert!(self.queued > 0, "a grant for a request never queued");
                self.queued -= 1;
                out.push((token, bufs));
            }
        }
    }

    /// The request `token` no longer wants buffers (its connection died).
    /// Buffers already granted but not yet polled go back to the pool;
    /// buffers already returned by `poll` are the caller's to free.
    pub fn cancel(&mut self, token: u64) {
        let found = (0..self.caches.len()).any(|class| self.cancel_in(class, token));
        if found {
            debug_assert!(self.queued > 0, "cancelled a request never queued");
            self.queued -= 1;
        }
    }

    /// `cancel` in one size class: whether `token` was queued there or
    /// granted from it.
    fn cancel_in(&mut self, class: usize, token: u64) -> bool {
        let (id, me, pool) = (self.id, self.me.clone(), self.pool.clone());
        let (found, wake) = self
            .pool
            .lock()
            .run(class, &self.pool.waiting, |p, cached, out| {
                if p.cancel(id, token, cached, out) {
                    return true;
                }
                let mut grants = me.grants();
                let granted_here = |(t, bufs): &(u64, Vec<BufId>)| {
                    *t == token && bufs.first().is_none_or(|&b| pool.class(b) == class)
                };
                let Some(pos) = grants.iter().position(granted_here) else {
                    return false;
                };
                let (_, bufs) = grants.remove(pos);
                drop(grants);
                let pending = me
                    .granted_pending
                    .fetch_sub(bufs.len() as u32, Ordering::AcqRel);
                debug_assert!(pending >= bufs.len() as u32, "a grant cancelled twice");
                p.give_back(bufs, cached, out);
                true
            });
        wake_all(wake);
        found
    }

    /// Buffers this reactor's requests hold, of both classes.
    pub fn in_use(&self) -> u64 {
        self.in_use.iter().sum()
    }

    /// Bytes of the buffers this reactor's requests hold.
    pub fn in_use_bytes(&self) -> u64 {
        let classes = &self.pool.classes;
        self.in_use
            .iter()
            .zip(classes)
            .map(|(&n, c)| n * u64::from(c.size))
            .sum()
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            in_use: self.in_use(),
            in_use_bytes: self.in_use_bytes(),
            cached: self.caches.iter().map(|c| c.len() as u64).sum(),
            waits: self.waits,
            queued: self.queued,
        }
    }
}

#[cfg(test)]
mod tests {
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
}
