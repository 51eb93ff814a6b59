//! One device's queued IO: a FIFO per (tenant, flow). A flow whose window
//! is closed is passed over, so its IOs never hold back other flows' behind
//! them. Among the open flows of a tenant, the one that has had the least
//! device time goes first (start-time fair queuing): the oracle divides a
//! drive between hosts in equal device time, and oldest-first divided it by
//! how much each host queued: in fuzz case 1:79, hosts of 128 KiB NBD
//! reads and writes beside deep NVMe/TCP readers on one drive got 1-5% of
//! their share, and 72-100% in fair order. Lookups cost one step per flow
//! with IO queued here, not per IO.

use std::cell::Cell;
use std::collections::VecDeque;

use super::ablate::{self, Mechanism};
use super::{DeviceNs, PacedIo};
use crate::Nanos;

#[derive(Debug, Clone, Copy)]
struct Queued {
    io: PacedIo,
    at: Nanos,
    /// Enqueue order: ties in `at` keep arrival order.
    seq: u64,
    /// Its device time, which advances its flow's virtual start.
    work: DeviceNs,
}

#[derive(Debug, Clone)]
struct FlowQueue {
    flow: u64,
    /// The virtual device time at which its front IO starts (start-time
    /// fair queuing): flows at one device take equal device time.
    start: DeviceNs,
    ios: VecDeque<Queued>,
    /// Whether its front IO (by id) might go, asked in memo generation
    /// `gen` (see `head_memo`; 0: never asked).
    open: Cell<Memo>,
}

/// A flow's answer to `open`, kept while nothing it reads changes.
#[derive(Debug, Clone, Copy, Default)]
struct Memo {
    gen: u64,
    io: u64,
    open: bool,
}

/// Where an IO sits: tenant `t`'s lane, flow queue `fq`, at its front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub tenant: usize,
    fq: usize,
}

#[derive(Debug, Clone, Default)]
pub(super) struct DeviceQueue {
    /// Per tenant: the flows with IO queued here.
    lanes: Vec<Vec<FlowQueue>>,
    /// Per tenant: the virtual start of the IO last taken.
    vtimes: Vec<DeviceNs>,
    /// Per tenant: the device time queued.
    work: Vec<DeviceNs>,
    len: usize,
    seq: u64,
    /// Emptied flow queues' buffers, for the next flows: a flow whose one
    /// IO is released at once empties its queue on every IO.
    spare: Vec<VecDeque<Queued>>,
}

/// The generation of the answers a poll keeps (flows' `open` in
/// `head_memo`, devices' windows and hold ratios): a poll asks the same
/// questions again and again, each turn and at its end. A poll begins a
/// generation, each release (which changes what the answers read: its
/// flow's, host's, pool's and device's books, its tenant's queue) begins
/// the next, and between polls none is kept.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PollMemo {
    last: u64,
    on: bool,
}

impl PollMemo {
    /// A poll starts asking.
    pub fn begin(&mut self) {
        self.last += 1;
        self.on = true;
    }

    /// What the answers read changed: those kept are stale.
    pub fn changed(&mut self) {
        if self.on {
            self.last += 1;
        }
    }

    /// The poll is over: the answers read state that changes between polls.
    pub fn end(&mut self) {
        self.on = false;
    }

    /// The generation under way, if any.
    pub fn gen(&self) -> Option<u64> {
        self.on.then_some(self.last)
    }

    /// `value()`, kept in `memo` for the generation under way.
    pub fn keep<T: Copy>(&self, memo: &Cell<(u64, T)>, value: impl FnOnce() -> T) -> T {
        let Some(gen) = self.gen() else {
            return value();
        };
        match memo.get() {
            (g, v) if g == gen => v,
            _ => {
                let v = value();
                memo.set((gen, v));
                v
            }
        }
    }
}

/// At most this many emptied flow queues' buffers are kept.
const SPARE_QUEUES: usize = 8;

impl DeviceQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, io: PacedIo, now: Nanos, work: DeviceNs) {
        if self.lanes.len() <= io.tenant {
            self.lanes.resize_with(io.tenant + 1, Vec::new);
            self.vtimes.resize(io.tenant + 1, DeviceNs::ZERO);
            self.work.resize(io.tenant + 1, DeviceNs::ZERO);
        }
        self.work[io.tenant] += work;
        self.seq += 1;
        let q = Queued {
            io,
            at: now,
            seq: self.seq,
            work,
        };
        let vtime = self.vtimes[io.tenant];
        let lane = &mut self.lanes[io.tenant];
        match lane.iter_mut().find(|f| f.flow == io.flow) {
            Some(f) => f.ios.push_back(q),
            None => {
                let mut ios = self.spare.pop().unwrap_or_default();
                ios.push_back(q);
                lane.push(FlowQueue {
                    flow: io.flow,
                    start: vtime,
                    ios,
                    open: Cell::default(),
                });
            }
        }
        self.len += 1;
    }

    /// How many flows have IO queued here.
    pub fn flows(&self) -> usize {
        self.lanes.iter().map(Vec::len).sum()
    }

    /// How many tenants have had IO queued here (some may have none now).
    pub fn tenants(&self) -> usize {
        self.lanes.len()
    }

    /// Tenant `t`'s device time queued here.
    pub fn tenant_work(&self, t: usize) -> DeviceNs {
        self.work.get(t).copied().unwrap_or_default()
    }

    /// Tenant `t` has IO queued here.
    pub fn has(&self, t: usize) -> bool {
        self.lanes.get(t).is_some_and(|l| !l.is_empty())
    }

    /// Tenant `t`'s next IO here among the flows that `open` lets go: the
    /// front of the flow with the least virtual start (see `FlowQueue`),
    /// the oldest among equals, or the oldest alone with that taken out.
    pub fn head(&self, t: usize, open: impl Fn(&PacedIo) -> bool) -> Option<Slot> {
        self.find(t, |_, io| open(io))
    }

    /// As `head`, with each flow's answer kept for generation `gen` (at
    /// least 1, see `PollMemo`): nothing `open` reads changes until the
    /// caller starts a new one. The answer is kept for the front IO it was
    /// asked about (by id), whose bytes and device it read.
    pub fn head_memo(&self, t: usize, gen: u64, open: impl Fn(&PacedIo) -> bool) -> Option<Slot> {
        debug_assert!(gen > 0, "generation 0 is a queue's never-asked flows");
        self.find(t, |f, io| {
            let m = f.open.get();
            if m.gen == gen && m.io == io.id {
                return m.open;
            }
            let open = open(io);
            f.open.set(Memo {
                gen,
                io: io.id,
                open,
            });
            open
        })
    }

    fn find(&self, t: usize, open: impl Fn(&FlowQueue, &PacedIo) -> bool) -> Option<Slot> {
        let lane = self.lanes.get(t)?;
        // One flow queued (one host, one connection): no order to find,
        // and this runs at least once per poll.
        if let [f] = lane.as_slice() {
            return f
                .ios
                .front()
                .filter(|q| open(f, &q.io))
                .map(|_| Slot { tenant: t, fq: 0 });
        }
        let fair = !ablate::out(Mechanism::FlowFair);
        lane.iter()
            .enumerate()
            .filter_map(|(i, f)| f.ios.front().map(|q| (i, f, q)))
            .filter(|(_, f, q)| open(f, &q.io))
            .min_by_key(|(_, f, q)| (if fair { f.start } else { DeviceNs::ZERO }, q.at, q.seq))
            .map(|(fq, _, _)| Slot { tenant: t, fq })
    }

    pub fn io(&self, s: Slot) -> PacedIo {
        self.front(s).io
    }

    /// When the IO at `s` was queued.
    pub fn arrived(&self, s: Slot) -> Nanos {
        self.front(s).at
    }

    fn front(&self, s: Slot) -> &Queued {
        self.lanes[s.tenant][s.fq]
            .ios
            .front()
            .expect("a slot names a flow queue with IO")
    }

    /// When the oldest IO queued here arrived.
    pub fn oldest(&self) -> Option<Nanos> {
        self.lanes
            .iter()
            .flatten()
            .filter_map(|f| f.ios.front().map(|q| q.at))
            .min()
    }

    /// Takes the IO at `s` out.
    pub fn take(&mut self, s: Slot) -> PacedIo {
        let lane = &mut self.lanes[s.tenant];
        let q = lane[s.fq]
            .ios
            .pop_front()
            .expect("a slot names a flow queue with IO");
        self.vtimes[s.tenant] = lane[s.fq].start;
        lane[s.fq].start += q.work;
        debug_assert!(self.work[s.tenant] >= q.work, "took more work than queued");
        self.work[s.tenant] -= q.work;
        if lane[s.fq].ios.is_empty() {
            let emptied = lane.swap_remove(s.fq);
            if self.spare.len() < SPARE_QUEUES {
                self.spare.push(emptied.ios);
            }
        }
        debug_assert!(self.len > 0, "took from an empty device queue");
        self.len -= 1;
        q.io
    }

    /// Removes IO `id` (a cancel); slow, cancels are rare.
    pub fn remove(&mut self, id: u64) -> Option<PacedIo> {
        let (tenant, fq, pos) = self.lanes.iter().enumerate().find_map(|(t, lane)| {
            lane.iter().enumerate().find_map(|(fq, f)| {
                let pos = f.ios.iter().position(|q| q.io.id == id)?;
                Some((t, fq, pos))
            })
        })?;
        if pos == 0 {
            return Some(self.take(Slot { tenant, fq }));
        }
        let q = self.lanes[tenant][fq].ios.remove(pos)?;
        self.work[tenant] -= q.work;
        self.len -= 1;
        Some(q.io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(id: u64, flow: u64, tenant: usize) -> PacedIo {
        PacedIo::read_4k(id, flow, tenant)
    }

    #[test]
    fn a_flow_that_had_less_device_time_goes_before_older_io() {
        let mut q = DeviceQueue::default();
        // A deep flow queues three IOs, then a flow with one arrives.
        for id in 1..=3 {
            q.push(io(id, 7, 0), id, DeviceNs(100));
        }
        q.push(io(4, 8, 0), 10, DeviceNs(100));
        let all = |_: &PacedIo| true;
        assert_eq!(q.take(q.head(0, all).expect("io 1")).id, 1);
        // Flow 7 has had 100 ns; flow 8 starts where the device is.
        assert_eq!(q.take(q.head(0, all).expect("io 4")).id, 4);
        assert_eq!(q.take(q.head(0, all).expect("io 2")).id, 2);
        assert_eq!(q.take(q.head(0, all).expect("io 3")).id, 3);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn fifo_across_open_flows_and_closed_flows_are_passed_over() {
        let mut q = DeviceQueue::default();
        q.push(io(1, 7, 0), 10, DeviceNs(1));
        q.push(io(2, 8, 0), 10, DeviceNs(1));
        q.push(io(3, 7, 0), 11, DeviceNs(1));
        q.push(io(4, 9, 1), 5, DeviceNs(1));
        assert_eq!(q.len(), 4);
        assert_eq!(q.oldest(), Some(5));
        let all = |_: &PacedIo| true;
        let s = q.head(0, all).expect("tenant 0 has IO");
        assert_eq!(q.io(s).id, 1, "equal arrival: the first queued");
        let s = q.head(0, |io| io.flow != 7).expect("flow 8 is open");
        assert_eq!(q.take(s).id, 2);
        assert!(q.head(0, |io| io.flow != 7).is_none());
        assert_eq!(q.remove(3).map(|io| io.id), Some(3));
        assert_eq!(q.take(q.head(0, all).expect("io 1")).id, 1);
        assert!(!q.has(0));
        assert!(q.has(1));
        assert_eq!(q.len(), 1);
        assert_eq!(q.remove(99), None);
    }
}
