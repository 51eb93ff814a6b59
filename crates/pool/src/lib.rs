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

pub use policy::{BufCache, BufRequest, PoolEvent, PoolPolicy};

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
            held: (0, 0),
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
    fn give_back(&self, class: usize, bufs: &[BufId]) {
        let ((), wake) = self.lock().run(class, &self.waiting, |p, cached, out| {
            p.give_back(bufs.iter().copied(), cached, out)
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
    /// `in_use`'s buffers and their bytes, kept as they change: the
    /// engine samples both on every turn of its loop.
    held: (u64, u64),
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

    /// `n` more buffers of `class` are held.
    fn hold(&mut self, class: usize, n: u64) {
        self.in_use[class] += n;
        let bytes = n * u64::from(self.pool.classes[class].size);
        self.held = (self.held.0 + n, self.held.1 + bytes);
    }

    fn set_cached(&self, class: usize) {
        self.me.cached[class].store(self.caches[class].len() as u32, Ordering::Release);
    }

    /// Buffers for `len` bytes: from the cache, then the shared pool, else
    /// `token` is queued FIFO and its buffers arrive through [`Self::poll`].
    pub fn alloc(&mut self, len: u32, token: u64) -> Alloc {
        let mut bufs = Vec::new();
        if self.alloc_into(len, token, &mut bufs) {
            Alloc::Ready(bufs)
        } else {
            Alloc::Queued
        }
    }

    /// As [`Self::alloc`], the buffers appended to `out` (true) or queued
    /// (false, `out` unchanged). The engine passes the vector its request
    /// slot keeps, so a served IO allocates no vector of its own.
    pub fn alloc_into(&mut self, len: u32, token: u64, out: &mut Vec<BufId>) -> bool {
        let (class, n) = self.class_for(len);
        if n == 0 {
            return true;
        }
        if self.caches[class].take(n as usize, self.pool.nobody_waits(), out) {
            self.set_cached(class);
            self.hold(class, u64::from(n));
            return true;
        }
        let (id, cache) = (self.id, &mut self.caches[class]);
        let req = BufRequest {
            reactor: id,
            token,
            count: n,
        };
        // This reactor's cache is pooled first, so it is empty while the
        // policy looks at who caches (its own atomic is stale until below).
        let (ready, wake) = self
            .pool
            .lock()
            .run(class, &self.pool.waiting, |p, cached, events| {
                p.alloc(cache, req, |r| r != id && cached(r), events, out)
            });
        self.set_cached(class);
        wake_all(wake);
        if ready {
            self.hold(class, u64::from(n));
        } else {
            self.waits += 1;
            self.queued += 1;
        }
        ready
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
        let bytes = bufs.len() as u64 * u64::from(self.pool.classes[class].size);
        self.held = (self.held.0 - bufs.len() as u64, self.held.1 - bytes);
        let rest = self.caches[class].keep(bufs, self.pool.nobody_waits());
        self.set_cached(class);
        if !rest.is_empty() {
            self.pool.give_back(class, rest);
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
                self.pool.give_back(class, &cache);
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
                    self.hold(self.pool.class(b), bufs.len() as u64);
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
        debug_assert_eq!(self.held.0, self.in_use.iter().sum::<u64>());
        self.held.0
    }

    /// Bytes of the buffers this reactor's requests hold.
    pub fn in_use_bytes(&self) -> u64 {
        let classes = &self.pool.classes;
        debug_assert_eq!(
            self.held.1,
            (self.in_use.iter().zip(classes))
                .map(|(&n, c)| n * u64::from(c.size))
                .sum::<u64>()
        );
        self.held.1
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
mod tests;
