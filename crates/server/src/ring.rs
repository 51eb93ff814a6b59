//! The reactor's io_uring, with a submission backlog. An SQE that finds the
//! submission queue full (more SQEs in one turn than the ring has entries,
//! or a kernel answering EBUSY while its completion queue overflows) waits
//! in the backlog, in order, and moves into the queue as room frees; the
//! reactor meanwhile goes on reaping completions, which is what frees the
//! kernel. Nothing here ever loops on `submit`, so no answer of the kernel
//! can spin the reactor.
//!
//! A linked chain (`IO_LINK`) is one group: it enters the queue whole, in
//! one submit, or waits whole, so the kernel never sees it cut in two.

use std::collections::VecDeque;
use std::io;

use io_uring::{squeue, IoUring, Submitter};

/// Longest linked chain a bdev builds; a ring has room for at least this.
pub const MAX_CHAIN: usize = 8;

pub struct Ring {
    ring: IoUring,
    /// SQEs waiting for room, as groups: one SQE, or a whole chain.
    backlog: VecDeque<Vec<squeue::Entry>>,
    /// SQEs that ever waited in the backlog (a statistic for tests and logs).
    backlogged: u64,
}

impl Ring {
    /// A ring of `entries` SQEs (at least [`MAX_CHAIN`]) and twice as many
    /// CQEs: single issuer and deferred task running where the kernel has them.
    pub fn new(entries: u32) -> io::Result<Ring> {
        let entries = entries.max(MAX_CHAIN as u32);
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))?;
        Ok(Ring {
            ring,
            backlog: VecDeque::new(),
            backlogged: 0,
        })
    }

    pub fn params(&self) -> &io_uring::Parameters {
        self.ring.params()
    }

    pub fn submitter(&self) -> Submitter<'_> {
        self.ring.submitter()
    }

    /// SQEs in the submission queue, not yet submitted.
    pub fn queued(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// Groups waiting in the backlog.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    pub fn backlogged_total(&self) -> u64 {
        self.backlogged
    }

    fn room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Queues `sqes` (one SQE or a linked chain) behind everything queued
    /// before: into the submission queue if they all fit and nothing waits,
    /// else into the backlog, which the next turn's submit makes room for.
    ///
    /// # Safety
    /// Every SQE must point at memory that stays valid until its completion.
    pub unsafe fn push(&mut self, sqes: &[squeue::Entry]) {
        debug_assert!(sqes.len() <= MAX_CHAIN, "a chain of {}", sqes.len());
        if self.backlog.is_empty() && self.room() >= sqes.len() {
            // SAFETY: the caller's promise; room was checked above.
            unsafe { self.push_now(sqes) };
            return;
        }
        self.backlogged += sqes.len() as u64;
        self.backlog.push_back(sqes.to_vec());
    }

    /// # Safety
    /// As [`Ring::push`]; the queue has room for all of `sqes`.
    unsafe fn push_now(&mut self, sqes: &[squeue::Entry]) {
        let mut sq = self.ring.submission();
        for sqe in sqes {
            // SAFETY: the caller's promise on the SQE's memory.
            let pushed = unsafe { sq.push(sqe) };
            debug_assert!(pushed.is_ok(), "no room after checking for it");
        }
    }

    /// Moves backlogged groups into the submission queue while they fit, in
    /// order: true when the backlog is empty.
    pub fn drain_backlog(&mut self) -> bool {
        while let Some(need) = self.backlog.front().map(Vec::len) {
            if self.room() < need {
                return false;
            }
            if let Some(group) = self.backlog.pop_front() {
                // SAFETY: promised when the group was pushed.
                unsafe { self.push_now(&group) };
            }
        }
        true
    }

    /// Collects the completions posted so far as (user data, result).
    pub fn completions(&mut self, out: &mut Vec<(u64, i32)>) {
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::opcode;

    fn nop(i: u64) -> squeue::Entry {
        opcode::Nop::new().build().user_data(i)
    }

    /// Submits and reaps as a reactor turn does (never waiting), until
    /// `n` completions came back; how many turns that took.
    fn turns_until(ring: &mut Ring, n: usize, got: &mut Vec<(u64, i32)>) -> usize {
        for turn in 1..10_000 {
            ring.drain_backlog();
            match ring.submitter().submit() {
                Ok(_) => {}
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}"),
            }
            ring.completions(got);
            if got.len() >= n {
                return turn;
            }
        }
        panic!("{} of {n} completions after 10,000 turns", got.len());
    }

    #[test]
    fn a_tiny_ring_takes_many_sqes_through_its_backlog_in_order() {
        let mut ring = Ring::new(8).expect("io_uring");
        let n = 1000u64;
        for i in 0..n {
            // SAFETY: NOPs point at no memory.
            unsafe { ring.push(&[nop(i)]) };
        }
        assert!(ring.backlog_len() > 0 && ring.backlogged_total() > 0);
        let mut got = Vec::new();
        turns_until(&mut ring, n as usize, &mut got);
        assert_eq!(ring.backlog_len(), 0);
        let order: Vec<u64> = got.iter().map(|c| c.0).collect();
        assert_eq!(order, (0..n).collect::<Vec<_>>(), "in the order pushed");
    }

    #[test]
    fn a_chain_waits_whole_and_a_full_completion_queue_only_slows_it() {
        let mut ring = Ring::new(8).expect("io_uring");
        // Fill the SQ and, submitted without reaping, overflow the 16-entry
        // CQ: the kernel keeps the overflow and may answer EBUSY.
        for i in 0..40 {
            // SAFETY: NOPs point at no memory.
            unsafe { ring.push(&[nop(i)]) };
            let _ = ring.submitter().submit();
            ring.drain_backlog();
        }
        let chain: Vec<squeue::Entry> = (100..104)
            .map(|i| nop(i).flags(squeue::Flags::IO_LINK))
            .chain([nop(104)])
            .collect();
        // SAFETY: NOPs point at no memory.
        unsafe { ring.push(&chain) };
        let mut got = Vec::new();
        turns_until(&mut ring, 45, &mut got);
        let chained: Vec<(u64, i32)> = got.iter().filter(|c| c.0 >= 100).copied().collect();
        assert_eq!(chained, (100..105).map(|i| (i, 0)).collect::<Vec<_>>());
        assert_eq!(got.len(), 45);
    }
}
