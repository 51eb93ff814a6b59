//! The target's buffer pool in simulated time: the real pool's policy
//! ([`PoolPolicy`]) with one cache per reactor, delivering grants and cache
//! drains at once (a real reactor's waker makes that its next loop).

use std::collections::VecDeque;

use pace::pool::{BufCache, BufId, PoolEvent, PoolPolicy};

pub struct SimPool {
    policy: PoolPolicy,
    caches: Vec<BufCache>,
    /// Buffers held by requests (not free, not cached).
    pub in_use: u64,
}

impl SimPool {
    pub fn new(total: u32, cache_size: u32, reactors: usize) -> SimPool {
        let mut policy = PoolPolicy::new(total, cache_size);
        let caches = (0..reactors).map(|_| policy.add_reactor().1).collect();
        SimPool {
            policy,
            caches,
            in_use: 0,
        }
    }

    /// `n` buffers for request `token` of `reactor`, or `None`: queued, its
    /// buffers come back later from [`Self::free`] in `granted`.
    pub fn alloc(
        &mut self,
        reactor: usize,
        n: u32,
        token: u64,
        granted: &mut Vec<(u64, Vec<BufId>)>,
    ) -> Option<Vec<BufId>> {
        let nobody_waits = self.policy.waiting() == 0;
        let bufs = match self.caches[reactor].take(n as usize, nobody_waits) {
            Some(bufs) => Some(bufs),
            None => {
                let mut events = Vec::new();
                let mut cache = std::mem::take(&mut self.caches[reactor]);
                let caches = &self.caches;
                let bufs = self.policy.alloc(
                    &mut cache,
                    reactor,
                    n,
                    token,
                    |r| !caches[r].is_empty(),
                    &mut events,
                );
                self.caches[reactor] = cache;
                self.deliver(events, granted);
                bufs
            }
        };
        if bufs.is_some() {
            self.in_use += u64::from(n);
        }
        bufs
    }

    /// Returns a request's buffers on `reactor`; requests they serve are
    /// appended to `granted`, in the pool's order.
    pub fn free(&mut self, reactor: usize, bufs: &[BufId], granted: &mut Vec<(u64, Vec<BufId>)>) {
        debug_assert!(self.in_use >= bufs.len() as u64);
        self.in_use -= bufs.len() as u64;
        let nobody_waits = self.policy.waiting() == 0;
        let rest = self.caches[reactor].keep(bufs, nobody_waits);
        if rest.is_empty() {
            return;
        }
        let mut events = Vec::new();
        let caches = &self.caches;
        self.policy
            .give_back(rest.to_vec(), |r| !caches[r].is_empty(), &mut events);
        self.deliver(events, granted);
    }

    /// Hands grants out in order, and drains the caches asked for (which
    /// may serve more waiters).
    fn deliver(&mut self, events: Vec<PoolEvent>, granted: &mut Vec<(u64, Vec<BufId>)>) {
        let mut queue = VecDeque::from(events);
        let mut more = Vec::new();
        while let Some(event) = queue.pop_front() {
            match event {
                PoolEvent::Grant { token, bufs, .. } => {
                    self.in_use += bufs.len() as u64;
                    granted.push((token, bufs));
                }
                PoolEvent::Drain { reactor } => {
                    let idle = self.caches[reactor].drain();
                    let caches = &self.caches;
                    self.policy
                        .give_back(idle, |r| !caches[r].is_empty(), &mut more);
                    queue.extend(more.drain(..));
                }
            }
        }
    }
}
