//! One device's queued IO: a FIFO per (tenant, flow). A flow whose window
//! is closed is passed over, so its IOs never hold back other flows' behind
//! them; the oldest IO of the open flows goes first, which is the device's
//! FIFO order while every flow is open. Lookups cost one step per flow with
//! IO queued here, not per IO.

use std::collections::VecDeque;

use super::PacedIo;
use crate::Nanos;

#[derive(Debug, Clone, Copy)]
struct Queued {
    io: PacedIo,
    at: Nanos,
    /// Enqueue order: ties in `at` keep arrival order.
    seq: u64,
}

#[derive(Debug, Clone)]
struct FlowQueue {
    flow: u64,
    ios: VecDeque<Queued>,
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
    len: usize,
    seq: u64,
}

impl DeviceQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, io: PacedIo, now: Nanos) {
        if self.lanes.len() <= io.tenant {
            self.lanes.resize_with(io.tenant + 1, Vec::new);
        }
        self.seq += 1;
        let q = Queued {
            io,
            at: now,
            seq: self.seq,
        };
        let lane = &mut self.lanes[io.tenant];
        match lane.iter_mut().find(|f| f.flow == io.flow) {
            Some(f) => f.ios.push_back(q),
            None => lane.push(FlowQueue {
                flow: io.flow,
                ios: VecDeque::from([q]),
            }),
        }
        self.len += 1;
    }

    /// Tenant `t` has IO queued here.
    pub fn has(&self, t: usize) -> bool {
        self.lanes.get(t).is_some_and(|l| !l.is_empty())
    }

    /// Tenant `t`'s oldest IO here among the flows that `open` lets go.
    pub fn head(&self, t: usize, open: impl Fn(&PacedIo) -> bool) -> Option<Slot> {
        let lane = self.lanes.get(t)?;
        lane.iter()
            .enumerate()
            .filter_map(|(i, f)| f.ios.front().map(|q| (i, q)))
            .filter(|(_, q)| open(&q.io))
            .min_by_key(|(_, q)| (q.at, q.seq))
            .map(|(fq, _)| Slot { tenant: t, fq })
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
        if lane[s.fq].ios.is_empty() {
            lane.swap_remove(s.fq);
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
        let io = self.lanes[tenant][fq].ios.remove(pos).map(|q| q.io);
        self.len -= 1;
        io
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacer::IoKind;

    fn io(id: u64, flow: u64, tenant: usize) -> PacedIo {
        PacedIo {
            id,
            flow,
            device: 0,
            tenant,
            bytes: 4096,
            kind: IoKind::Read,
            offset: 0,
        }
    }

    #[test]
    fn fifo_across_open_flows_and_closed_flows_are_passed_over() {
        let mut q = DeviceQueue::default();
        q.push(io(1, 7, 0), 10);
        q.push(io(2, 8, 0), 10);
        q.push(io(3, 7, 0), 11);
        q.push(io(4, 9, 1), 5);
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
