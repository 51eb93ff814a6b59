//! The data buffer pool: one shared pool with per-reactor caches, as SPDK
//! has, where a waiter is served in turn and idle caches drain back. The
//! policy (who gets which buffers, who waits, when caches drain) is [`PoolPolicy`], sans-IO and shared with the
//! simulator; this module is its threaded driver:
//!
//! - The fast path (cache hit, cache free, nobody waiting) takes no lock.
//! - Everything else runs the policy under one mutex. A waiter served by a
//!   free on another reactor gets its buffers as a grant, and its reactor is
//!   woken through its waker; so is a reactor asked to drain its cache.

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
    /// Buffers parked in this reactor's cache.
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
    cached: AtomicU32,
    granted_pending: AtomicU32,
}

impl ReactorShared {
    fn grants(&self) -> MutexGuard<'_, Vec<(u64, Vec<BufId>)>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Inner {
    policy: PoolPolicy,
    reactors: Vec<Arc<ReactorShared>>,
}

impl Inner {
    /// Runs `op` on the policy, with each reactor's cache as its atomics
    /// say, then hands out what it decided. Returns the reactors to wake
    /// (woken after the lock is dropped).
    fn run<T>(
        &mut self,
        waiting: &AtomicUsize,
        op: impl FnOnce(&mut PoolPolicy, &dyn Fn(usize) -> bool, &mut Vec<PoolEvent>) -> T,
    ) -> (T, Vec<Arc<ReactorShared>>) {
        let mut events = Vec::new();
        let reactors = &self.reactors;
        let cached = |r: usize| reactors[r].cached.load(Ordering::Acquire) > 0;
        let result = op(&mut self.policy, &cached, &mut events);
        waiting.store(self.policy.waiting(), Ordering::Release);
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

impl SharedPool {
    pub fn new(cfg: PoolConfig) -> io::Result<Arc<SharedPool>> {
        if cfg.buffer_size == 0
            || !cfg.buffer_size.is_multiple_of(4096)
            || cfg.num_shared_buffers == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer_size must be a non-zero multiple of 4096 and num_shared_buffers at least 1",
            ));
        }
        let map_len = cfg.num_shared_buffers as usize * cfg.buffer_size as usize;
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
        Ok(Arc::new(SharedPool {
            base: base.cast(),
            map_len,
            cfg,
            inner: Mutex::new(Inner {
                policy: PoolPolicy::new(cfg.num_shared_buffers, cfg.buf_cache_size),
                reactors: Vec::new(),
            }),
            waiting: AtomicUsize::new(0),
        }))
    }

    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    pub fn buffer_size(&self) -> u32 {
        self.cfg.buffer_size
    }

    pub fn total(&self) -> u32 {
        self.cfg.num_shared_buffers
    }

    /// Start of buffer `id`: 4 KiB aligned, `buffer_size` bytes, stable for the pool's life.
    pub fn ptr(&self, id: BufId) -> *mut u8 {
        debug_assert!(id.0 < self.cfg.num_shared_buffers);
        // SAFETY: id < num_shared_buffers keeps the offset inside the mapping.
        unsafe { self.base.add(id.0 as usize * self.cfg.buffer_size as usize) }
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
            cached: AtomicU32::new(0),
            granted_pending: AtomicU32::new(0),
        });
        let (id, cache) = {
            let mut inner = self.lock();
            inner.reactors.push(me.clone());
            inner.policy.add_reactor()
        };
        ReactorBufs {
            id,
            pool: self.clone(),
            me,
            cache,
            in_use: 0,
            waits: 0,
            queued: 0,
        }
    }

    /// Buffers not held by any request: shared, cached and granted-not-yet-polled.
    /// Equals `total()` when the target is quiescent.
    pub fn free_total(&self) -> u64 {
        let inner = self.lock();
        let mut n = inner.policy.free_len() as u64;
        for r in &inner.reactors {
            n += u64::from(r.cached.load(Ordering::Acquire));
            n += u64::from(r.granted_pending.load(Ordering::Acquire));
        }
        n
    }

    /// Returns buffers to the shared list and serves waiters.
    fn give_back(&self, bufs: Vec<BufId>) {
        let ((), wake) = self.lock().run(&self.waiting, |p, cached, out| {
            p.give_back(bufs, cached, out)
        });
        wake_all(wake);
    }

    fn nobody_waits(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }
}

/// One reactor's view of the pool: its cache and its queued requests. Owned
/// by the reactor thread.
pub struct ReactorBufs {
    id: usize,
    pool: Arc<SharedPool>,
    me: Arc<ReactorShared>,
    cache: BufCache,
    in_use: u64,
    waits: u64,
    queued: u64,
}

impl ReactorBufs {
    pub fn pool(&self) -> &Arc<SharedPool> {
        &self.pool
    }

    pub fn buffers_for(&self, len: u32) -> u32 {
        len.div_ceil(self.pool.cfg.buffer_size)
    }

    fn set_cached(&self) {
        self.me
            .cached
            .store(self.cache.len() as u32, Ordering::Release);
    }

    /// Buffers for `len` bytes: from the cache, then the shared pool, else
    /// `token` is queued FIFO and its buffers arrive through [`Self::poll`].
    pub fn alloc(&mut self, len: u32, token: u64) -> Alloc {
        let n = self.buffers_for(len);
        if n == 0 {
            return Alloc::Ready(Vec::new());
        }
        if let Some(bufs) = self.cache.take(n as usize, self.pool.nobody_waits()) {
            self.set_cached();
            self.in_use += u64::from(n);
            return Alloc::Ready(bufs);
        }
        let (id, cache) = (self.id, &mut self.cache);
        // This reactor's cache is pooled first, so it is empty while the
        // policy looks at who caches (its own atomic is stale until below).
        let (ready, wake) = self.pool.lock().run(&self.pool.waiting, |p, cached, out| {
            p.alloc(cache, id, n, token, |r| r != id && cached(r), out)
        });
        self.set_cached();
        wake_all(wake);
        match ready {
            Some(bufs) => {
                self.in_use += u64::from(n);
                Alloc::Ready(bufs)
            }
            None => {
                self.waits += 1;
                self.queued += 1;
                Alloc::Queued
            }
        }
    }

    /// Returns a request's buffers: to the cache while nobody waits, else to
    /// the waiters.
    pub fn free(&mut self, bufs: &[BufId]) {
        if bufs.is_empty() {
            return;
        }
        debug_assert!(self.in_use >= bufs.len() as u64, "freeing buffers not held");
        self.in_use -= bufs.len() as u64;
        let rest = self.cache.keep(bufs, self.pool.nobody_waits());
        self.set_cached();
        if !rest.is_empty() {
            self.pool.give_back(rest.to_vec());
        }
    }

    /// Collects grants for this reactor's queued requests into `out`, and
    /// drains the cache when waiters need it. Cheap when nothing happened.
    pub fn poll(&mut self, out: &mut Vec<(u64, Vec<BufId>)>) {
        let asked = self.me.drain_cache.swap(false, Ordering::AcqRel);
        if self.cache.must_drain(asked, !self.pool.nobody_waits()) {
            let cache = self.cache.drain();
            self.set_cached();
            self.pool.give_back(cache);
        }
        if self.me.has_grants.swap(false, Ordering::AcqRel) {
            let grants = std::mem::take(&mut *self.me.grants());
            for (token, bufs) in grants {
                let pending = self
                    .me
                    .granted_pending
                    .fetch_sub(bufs.len() as u32, Ordering::AcqRel);
                debug_assert!(pending >= bufs.len() as u32, "grants polled twice");
                self.in_use += bufs.len() as u64;
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
        let id = self.id;
        let me = self.me.clone();
        let (found, wake) = self.pool.lock().run(&self.pool.waiting, |p, cached, out| {
            if p.cancel(id, token, cached, out) {
                return true;
            }
            let mut grants = me.grants();
            let Some(pos) = grants.iter().position(|(t, _)| *t == token) else {
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
        if found {
            debug_assert!(self.queued > 0, "cancelled a request never queued");
            self.queued -= 1;
        }
    }

    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            in_use: self.in_use,
            cached: self.cache.len() as u64,
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
        SharedPool::new(PoolConfig {
            num_shared_buffers: n,
            buffer_size: 4096,
            buf_cache_size: cache,
        })
        .expect("pool")
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
}
