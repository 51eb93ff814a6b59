//! The buffer pool's allocation policy, sans-IO: which buffers a request
//! gets, who waits, who is served next and when caches must drain. The
//! target's [`SharedPool`](super::SharedPool) wraps it in a mutex and
//! atomics; the simulator drives it directly, so both run the same policy.
//!
//! - Allocation goes cache, then shared list, then one FIFO wait queue
//!   shared by all reactors. A request takes all its buffers at once or
//!   waits: a partial set held while waiting could deadlock.
//! - While anyone waits, frees bypass the caches and go to the head of the
//!   queue, whichever reactor it is on. Reactors caching idle buffers are
//!   asked to drain, so cache size 0 and large caches both make progress.

use std::collections::VecDeque;

use super::BufId;

/// What a pool operation asks of the reactors (its driver delivers them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// Request `token` of `reactor` was waiting and now owns `bufs`.
    Grant {
        reactor: usize,
        token: u64,
        bufs: Vec<BufId>,
    },
    /// `reactor` caches idle buffers that a waiter needs: drain its cache.
    Drain { reactor: usize },
}

/// One reactor's cache of idle buffers, owned by that reactor.
#[derive(Debug, Default)]
pub struct BufCache {
    bufs: Vec<BufId>,
    limit: usize,
}

impl BufCache {
    pub fn new(limit: u32) -> BufCache {
        BufCache {
            bufs: Vec::with_capacity(limit as usize),
            limit: limit as usize,
        }
    }

    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The fast path: `n` buffers straight from the cache onto `out`,
    /// while nobody waits; false leaves both as they were.
    pub fn take(&mut self, n: usize, nobody_waits: bool, out: &mut Vec<BufId>) -> bool {
        if !nobody_waits || self.bufs.len() < n {
            return false;
        }
        out.extend(self.bufs.drain(self.bufs.len() - n..));
        true
    }

    /// Keeps what fits of freed `bufs` while nobody waits; returns the rest,
    /// which belongs on the shared list.
    pub fn keep<'a>(&mut self, bufs: &'a [BufId], nobody_waits: bool) -> &'a [BufId] {
        let room = if nobody_waits {
            (self.limit - self.bufs.len()).min(bufs.len())
        } else {
            0
        };
        debug_assert!(self.bufs.len() <= self.limit);
        self.bufs.extend_from_slice(&bufs[..room]);
        &bufs[room..]
    }

    /// Whether the cache must go back to the shared list now: a drain was
    /// asked, or someone waits while it holds buffers.
    pub fn must_drain(&self, asked: bool, someone_waits: bool) -> bool {
        asked || (someone_waits && !self.bufs.is_empty())
    }

    /// Empties the cache.
    pub fn drain(&mut self) -> Vec<BufId> {
        std::mem::take(&mut self.bufs)
    }
}

/// A request for buffers: whose, and how many it takes at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufRequest {
    pub reactor: usize,
    pub token: u64,
    pub count: u32,
}

/// The shared free list and the FIFO of requests waiting for buffers.
pub struct PoolPolicy {
    free: Vec<BufId>,
    waiters: VecDeque<BufRequest>,
    cache_size: usize,
    reactors: usize,
}

impl PoolPolicy {
    /// `total` buffers, all free; caches of `cache_size` each.
    pub fn new(total: u32, cache_size: u32) -> PoolPolicy {
        PoolPolicy::with_ids(0, total, cache_size)
    }

    /// As `new`, with ids `first..first + total` (one size class of a pool
    /// whose ids are global).
    pub fn with_ids(first: u32, total: u32, cache_size: u32) -> PoolPolicy {
        PoolPolicy {
            // Hand out low buffers first so a lightly loaded target touches little memory.
            free: (first..first + total).rev().map(BufId).collect(),
            waiters: VecDeque::new(),
            cache_size: cache_size as usize,
            reactors: 0,
        }
    }

    /// A new reactor's id and its (empty) cache.
    pub fn add_reactor(&mut self) -> (usize, BufCache) {
        self.reactors += 1;
        (self.reactors - 1, BufCache::new(self.cache_size as u32))
    }

    /// Requests waiting, over all reactors.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Buffers on the shared list.
    pub fn free_len(&self) -> usize {
        self.free.len()
    }

    /// The slow path of an allocation for `req`, after its reactor's cache
    /// could not serve it: pools the cache so the request is served as one
    /// set, then takes from the shared list onto `bufs` (true) and refills
    /// the cache (as SPDK does), or queues the request (false). `cached(r)`
    /// says whether reactor `r` holds idle buffers.
    pub fn alloc(
        &mut self,
        cache: &mut BufCache,
        req: BufRequest,
        cached: impl Fn(usize) -> bool,
        out: &mut Vec<PoolEvent>,
        bufs: &mut Vec<BufId>,
    ) -> bool {
        debug_assert!(req.reactor < self.reactors);
        let n = req.count as usize;
        self.free.append(&mut cache.bufs);
        if self.waiters.is_empty() && self.free.len() >= n {
            bufs.extend(self.free.drain(self.free.len() - n..));
            let keep = self.cache_size.min(self.free.len()) / 2;
            let at = self.free.len() - keep;
            cache.bufs.extend(self.free.drain(at..));
            return true;
        }
        self.waiters.push_back(req);
        self.serve_waiters(cached, out);
        false
    }

    /// Returns buffers to the shared list and serves waiters.
    pub fn give_back(
        &mut self,
        bufs: impl IntoIterator<Item = BufId>,
        cached: impl Fn(usize) -> bool,
        out: &mut Vec<PoolEvent>,
    ) {
        self.free.extend(bufs);
        self.serve_waiters(cached, out);
    }

    /// Removes request `token` of `reactor` from the queue; false if it
    /// was not queued (granted already, or never queued).
    pub fn cancel(
        &mut self,
        reactor: usize,
        token: u64,
        cached: impl Fn(usize) -> bool,
        out: &mut Vec<PoolEvent>,
    ) -> bool {
        let Some(pos) = self
            .waiters
            .iter()
            .position(|w| w.reactor == reactor && w.token == token)
        else {
            return false;
        };
        self.waiters.remove(pos);
        // Removing a head that blocked others may let them through.
        self.serve_waiters(cached, out);
        true
    }

    /// Serves queued requests in FIFO order from the shared list, and asks
    /// caching reactors to drain when the head cannot be served.
    fn serve_waiters(&mut self, cached: impl Fn(usize) -> bool, out: &mut Vec<PoolEvent>) {
        while let Some(head) = self.waiters.front() {
            let n = head.count as usize;
            if self.free.len() < n {
                out.extend(
                    (0..self.reactors)
                        .filter(|&r| cached(r))
                        .map(|reactor| PoolEvent::Drain { reactor }),
                );
                return;
            }
            let Some(head) = self.waiters.pop_front() else {
                return;
            };
            let bufs = self.free.split_off(self.free.len() - n);
            out.push(PoolEvent::Grant {
                reactor: head.reactor,
                token: head.token,
                bufs,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PoolPolicy::alloc` of `count` buffers for `token` of `reactor`:
    /// them, or None when it queued.
    fn alloc(
        p: &mut PoolPolicy,
        cache: &mut BufCache,
        (reactor, count, token): (usize, u32, u64),
        cached: impl Fn(usize) -> bool,
        out: &mut Vec<PoolEvent>,
    ) -> Option<Vec<BufId>> {
        let req = BufRequest {
            reactor,
            token,
            count,
        };
        let mut bufs = Vec::new();
        p.alloc(cache, req, cached, out, &mut bufs).then_some(bufs)
    }

    fn grants(events: &[PoolEvent]) -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| match e {
                PoolEvent::Grant { token, .. } => Some(*token),
                PoolEvent::Drain { .. } => None,
            })
            .collect()
    }

    #[test]
    fn alloc_refills_the_cache_with_half_its_size() {
        let mut p = PoolPolicy::new(100, 8);
        let (r, mut cache) = p.add_reactor();
        let mut out = Vec::new();
        let bufs = alloc(&mut p, &mut cache, (r, 2, 1), |_| false, &mut out);
        assert_eq!(bufs.map(|b| b.len()), Some(2));
        assert_eq!(cache.len(), 4);
        assert_eq!(p.free_len(), 94);
        // The next one comes from the cache, without the shared list.
        let mut taken = Vec::new();
        assert!(cache.take(3, true, &mut taken));
        assert_eq!(taken.len(), 3);
        assert!(!cache.take(3, true, &mut taken), "one left");
        assert_eq!(taken.len(), 3, "a failed take adds nothing");
    }

    #[test]
    fn frees_skip_the_cache_while_anyone_waits() {
        let mut p = PoolPolicy::new(2, 4);
        let (a, mut ca) = p.add_reactor();
        let (b, mut cb) = p.add_reactor();
        let mut out = Vec::new();
        let held = alloc(&mut p, &mut ca, (a, 2, 1), |_| false, &mut out).expect("free");
        assert_eq!(alloc(&mut p, &mut cb, (b, 1, 2), |_| false, &mut out), None);
        assert_eq!(p.waiting(), 1);
        let rest = ca.keep(&held, p.waiting() == 0);
        assert_eq!(rest.len(), 2, "nothing cached while b waits");
        p.give_back(rest.to_vec(), |_| false, &mut out);
        assert_eq!(grants(&out), vec![2]);
        assert_eq!(p.waiting(), 0);
        assert_eq!(p.free_len(), 1);
    }

    #[test]
    fn a_blocked_head_asks_caching_reactors_to_drain() {
        let mut p = PoolPolicy::new(4, 4);
        let (a, mut ca) = p.add_reactor();
        let (b, mut cb) = p.add_reactor();
        let mut out = Vec::new();
        let held = alloc(&mut p, &mut ca, (a, 4, 1), |_| false, &mut out).expect("free");
        assert!(ca.keep(&held, true).is_empty(), "all four cached");
        let cached = |r: usize| r == a;
        assert_eq!(alloc(&mut p, &mut cb, (b, 2, 7), cached, &mut out), None);
        assert_eq!(out, vec![PoolEvent::Drain { reactor: a }]);
        assert!(ca.must_drain(false, p.waiting() > 0));
        out.clear();
        p.give_back(ca.drain(), |_| false, &mut out);
        assert_eq!(grants(&out), vec![7]);
    }

    #[test]
    fn cancel_lets_the_next_waiter_through() {
        let mut p = PoolPolicy::new(2, 0);
        let (a, mut ca) = p.add_reactor();
        let mut out = Vec::new();
        let held = alloc(&mut p, &mut ca, (a, 1, 1), |_| false, &mut out).expect("free");
        assert_eq!(alloc(&mut p, &mut ca, (a, 2, 2), |_| false, &mut out), None);
        assert_eq!(alloc(&mut p, &mut ca, (a, 1, 3), |_| false, &mut out), None);
        assert!(p.cancel(a, 2, |_| false, &mut out));
        assert_eq!(grants(&out), vec![3], "the head needing 2 blocked it");
        assert!(!p.cancel(a, 2, |_| false, &mut out));
        assert_eq!(held.len(), 1);
    }
}
