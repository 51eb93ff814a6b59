//! How a reactor waits for completions: it sleeps in the kernel, spins
//! (`adaptive` while lightly loaded, `busy` always) or, busy, gathers (a
//! min-wait that lets one wake-up serve many requests; with `busy`, a
//! spin between a submit and a reap). [`Waiter`] keeps what that choice is
//! made from and makes each loop turn's submit-and-wait.

use std::io;
use std::time::{Duration, Instant};

use config::PollMode;
use io_uring::types;
use pace::Nanos;

use crate::gather::GatherTrial;
use crate::ring::Ring;

/// An idle stretch counts as this long a gap between device completions,
/// so after a pause a few close completions bring the spin back.
const DEVICE_GAP_CAP: Nanos = 1_000_000;

/// A loop turn that served this many requests makes the next wait gather:
/// one request at a time (QD 1) never waits longer than it must.
const BATCH_MIN_SERVED: u64 = 2;
/// How sure an `adaptive` reactor is that its spin catches the next
/// receive: an EWMA, out of `CATCH_ONE`, of the receives that came within
/// `poll_spin` of the completion before. It spins while at least half did.
const CATCH_ONE: u32 = 1 << 10;

/// A turn that received more than this carried payload: gathering would
/// let the clients' socket buffers fill and stall them, so it does not.
const BATCH_MAX_RECEIVED: usize = 4 << 10;
/// Completions a gathering wait asks for; its time limit usually ends it.
const BATCH_WANT: usize = 64;
/// `io_uring_enter(2)`'s flag to reap completions (and, with
/// `DEFER_TASKRUN`, to run the work that posts them); the io-uring crate
/// does not export it.
const IORING_ENTER_GETEVENTS: u32 = 1;

pub(super) struct Waiter {
    poll: PollMode,
    poll_spin: Nanos,
    /// When the last completion arrived: `adaptive` polls until `poll_spin`
    /// after it.
    last_completion: Nanos,
    /// IOs submitted to a device through the ring and not yet completed.
    device_ios: u64,
    /// Mean time between device completions (EWMA, capped). While device
    /// IO is out and its completions come further apart than `poll_spin`
    /// (a disk at QD 1: one every 150 us or more), `adaptive` sleeps
    /// instead of spinning through the wait; when they come close together
    /// (a disk at QD 32), the spin still catches each without a wake-up.
    device_gap: Nanos,
    last_device_done: Nanos,
    /// How many of the recent receives (out of `CATCH_ONE`) came within
    /// `poll_spin` of the completion before them, where a spin catches
    /// them. The others it does not: it ends in a sleep anyway, `poll_spin`
    /// of CPU per request for nothing (a client decrypting 64 KiB TLS
    /// replies, or across a real network).
    recv_catch: u32,
    /// Microseconds a busy reactor's wait gathers completions; zero when
    /// off or when the kernel cannot (no `IORING_FEAT_MIN_TIMEOUT`).
    batch_wait_us: u32,
    /// Requests the last loop turn served: the sign of a busy reactor.
    served: u64,
    /// Requests the last turn that served any served. A polling turn that
    /// finds nothing (or only receives) does not make a busy reactor
    /// lightly loaded: at QD 32 its sends still finish many at once.
    batch: u64,
    /// Bytes the last loop turn that completed receives received.
    received: usize,
    /// Whether gathering pays for this reactor's clients.
    gather: GatherTrial,
}

impl Waiter {
    /// `batch_wait`: zero when the ring cannot gather.
    pub(super) fn new(
        poll: PollMode,
        poll_spin: Duration,
        batch_wait: Duration,
        now: Nanos,
    ) -> Waiter {
        Waiter {
            poll,
            poll_spin: poll_spin.as_nanos() as Nanos,
            last_completion: now,
            device_ios: 0,
            device_gap: 0,
            last_device_done: now,
            recv_catch: CATCH_ONE,
            batch_wait_us: batch_wait.as_micros().min(u128::from(u32::MAX)) as u32,
            served: 0,
            batch: 0,
            received: 0,
            gather: GatherTrial::new(now),
        }
    }

    /// A turn's completions were reaped at `now`: `any`, and `recvs` when
    /// some were receives (whose bytes then count anew; a turn with only
    /// sends completing keeps the last one's).
    pub(super) fn on_completions(&mut self, now: Nanos, any: bool, recvs: bool) {
        if recvs {
            self.received = 0;
            // Within the spin that followed the completion before: caught.
            let caught = now <= self.last_completion + self.poll_spin;
            self.recv_catch = ewma_toward(self.recv_catch, if caught { CATCH_ONE } else { 0 });
        }
        if any {
            self.last_completion = now;
        }
    }

    /// A receive brought `bytes`.
    pub(super) fn on_received(&mut self, bytes: usize) {
        self.received += bytes;
    }

    /// A device IO went to the ring.
    pub(super) fn on_device_submit(&mut self) {
        self.device_ios += 1;
    }

    /// A device IO's chain completed at `now`.
    pub(super) fn on_device_done(&mut self, now: Nanos) {
        assert!(self.device_ios > 0, "a device IO completed twice");
        self.device_ios -= 1;
        let gap = (now - self.last_device_done).min(DEVICE_GAP_CAP);
        self.device_gap = (self.device_gap * 7 + gap) / 8;
        self.last_device_done = now;
    }

    /// The turn ended at `now` having served `served` requests.
    pub(super) fn on_turn(&mut self, now: Nanos, served: u64) {
        self.served = served;
        if served > 0 {
            self.batch = served;
        }
        self.gather.on_turn(now, served);
    }

    /// Whether a busy turn's wait gathers now (for the stats).
    pub(super) fn gathering(&self) -> bool {
        self.batch_wait_us > 0 && self.gather.gathering()
    }

    fn polling(&self, now: Nanos) -> bool {
        match self.poll {
            PollMode::Interrupt => false,
            // Only a lightly loaded reactor spins: its next request is one
            // client's next, which a sleep would delay by a wake-up. A busy
            // one gathers instead, and spinning would take the core its
            // clients need. Nor does one whose requests come further apart
            // than the spin lasts: it would sleep before the next anyway.
            PollMode::Adaptive => {
                (self.device_ios == 0 || self.device_gap < self.poll_spin)
                    && self.recv_catch >= CATCH_ONE / 2
                    && self.batch < BATCH_MIN_SERVED
                    && now < self.last_completion + self.poll_spin
            }
            PollMode::Busy => true,
        }
    }

    /// How long the next submit may wait: until `deadline` (the engine's
    /// next, asked only when it may sleep), or not at all while polling.
    fn timeout(&self, now: Nanos, deadline: impl FnOnce() -> Option<Nanos>) -> Option<Nanos> {
        if self.polling(now) {
            return Some(0);
        }
        Some(
            deadline()?
                // A deadline already past waits the minimum (a clamp).
                .saturating_sub(now)
                .max(1_000),
        )
    }

    /// Submits the queued SQEs and waits for a completion, the engine's next
    /// deadline or, polling, not at all. A reactor that served several
    /// requests last turn gathers: it sleeps up to `batch_wait_us` for more
    /// completions (the kernel's min-wait), so one wake-up, recv and send
    /// serve many requests; a `busy` one spins instead (`busy_turn`).
    pub(super) fn submit_and_wait(
        &mut self,
        ring: &mut Ring,
        now: Nanos,
        deadline: impl FnOnce() -> Option<Nanos>,
    ) -> io::Result<()> {
        if self.poll == PollMode::Busy {
            return self.busy_turn(ring, now, deadline);
        }
        let wait = self.timeout(now, deadline);
        let timeout = wait.map(|ns| {
            types::Timespec::new()
                .sec(ns / 1_000_000_000)
                .nsec((ns % 1_000_000_000) as u32)
        });
        let batch_wait_us = if self.gather.gathering() {
            self.batch_wait_us
        } else {
            0
        };
        let gather = gather_wait(batch_wait_us, self.served, self.received, wait);
        // SQEs waiting for room: submit, reap and come back for them.
        if wait == Some(0) || ring.backlog_len() > 0 {
            return submit_and_peek(ring);
        }
        let submitter = ring.submitter();
        let r = match (&timeout, gather) {
            (Some(ts), None) => {
                submitter.submit_with_args(1, &types::SubmitArgs::new().timespec(ts))
            }
            (None, None) => submitter.submit_and_wait(1),
            (Some(ts), Some(min_wait)) => {
                let args = types::SubmitArgs::new()
                    .timespec(ts)
                    .min_wait_usec(min_wait);
                submitter.submit_with_args(BATCH_WANT, &args)
            }
            (None, Some(min_wait)) => {
                let args = types::SubmitArgs::new().min_wait_usec(min_wait);
                submitter.submit_with_args(BATCH_WANT, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// A busy reactor's wait: it never sleeps, but after a turn that
    /// served several requests it gathers as a sleeping one does. Peeking
    /// at once took the clients' next requests a few at a time as they
    /// came, one recv, reply send and turn for each few: at QD 32 `busy`
    /// served fewer 4 KiB reads than `adaptive`, which sleeps through its
    /// gathering wait (304k against 324k IOPS, BENCHMARKS.md's sixth
    /// NVMe/TCP run). So it submits (the replies leave now, and a recv
    /// finding no bytes waits in the kernel without running), spins up to
    /// `batch_wait_us` (never past the engine's next deadline), then
    /// collects: the recv runs once, on every request that came meanwhile.
    fn busy_turn(
        &mut self,
        ring: &mut Ring,
        now: Nanos,
        deadline: impl FnOnce() -> Option<Nanos>,
    ) -> io::Result<()> {
        let us = if self.gather.gathering() {
            self.batch_wait_us
        } else {
            0
        };
        let spin = gather_wait(us, self.served, self.received, None).and_then(|us| {
            gather_wait(
                us,
                self.served,
                self.received,
                deadline().map(|d| d.saturating_sub(now)),
            )
        });
        if let (Some(us), 0) = (spin, ring.backlog_len()) {
            submit_only(ring)?;
            let end = Instant::now() + Duration::from_micros(u64::from(us));
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        }
        submit_and_peek(ring)
    }
}

/// One step of an EWMA (weight 1/8) from `from` toward `to`.
fn ewma_toward(from: u32, to: u32) -> u32 {
    (from * 7 + to) / 8
}

/// Submits the queued SQEs without running the ring's deferred work: a
/// recv whose bytes have not come stays armed, and completes (with every
/// byte come by then) only at the next enter that reaps.
fn submit_only(ring: &mut Ring) -> io::Result<()> {
    match ring.submitter().submit() {
        Ok(_) => Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => Ok(()),
            _ => Err(e),
        },
    }
}

/// A polling turn: submits and collects whatever completed, never
/// waits. Asking for no completions skips the kernel's wait set-up (a
/// timer armed and torn down): a zero timeout with one wanted cost
/// most of a spinning reactor's CPU in `io_cqring_wait`, and every
/// spin turn that costs less notices the next request sooner.
fn submit_and_peek(ring: &mut Ring) -> io::Result<()> {
    let to_submit = ring.queued() as u32;
    // SAFETY: no argument is passed; GETEVENTS with no completions
    // wanted only runs the ring's deferred work (which posts the
    // completions) and returns.
    let r = unsafe {
        ring.submitter()
            .enter::<libc::sigset_t>(to_submit, 0, IORING_ENTER_GETEVENTS, None)
    };
    match r {
        Ok(_) => Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => Ok(()),
            _ => Err(e),
        },
    }
}

/// How long, in microseconds, the next wait gathers completions, if at
/// all: only after a turn that served `served` requests and received no
/// payload (`received` bytes), only when the reactor may sleep (`wait` is
/// not zero), and never past the engine's deadline, which the kernel would
/// overshoot.
fn gather_wait(
    batch_wait_us: u32,
    served: u64,
    received: usize,
    wait: Option<Nanos>,
) -> Option<u32> {
    if batch_wait_us == 0 || served < BATCH_MIN_SERVED || received > BATCH_MAX_RECEIVED {
        return None;
    }
    match wait {
        Some(0) => None,
        Some(ns) => Some(u64::from(batch_wait_us).min((ns / 1_000).max(1)) as u32),
        None => Some(batch_wait_us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long one busy wait takes after a turn that served `served`,
    /// with the engine's next deadline `deadline` away.
    fn busy_wait_after(served: u64, deadline: Option<Nanos>) -> Duration {
        let mut ring = Ring::new(8).expect("io_uring");
        let gather = Duration::from_millis(20);
        let mut w = Waiter::new(PollMode::Busy, Duration::from_micros(50), gather, 0);
        w.on_turn(1_000, served);
        let t = Instant::now();
        w.submit_and_wait(&mut ring, 1_000, || deadline.map(|d| 1_000 + d))
            .expect("io_uring_enter");
        t.elapsed()
    }

    #[test]
    fn a_busy_reactor_spins_to_gather_only_after_a_busy_turn() {
        let gather = Duration::from_millis(20);
        // One request a turn (QD 1) is answered at once.
        assert!(busy_wait_after(1, None) < gather);
        // Several: it gathers for `batch_wait_us`.
        assert!(busy_wait_after(8, None) >= gather);
        // Never past the engine's next deadline.
        assert!(busy_wait_after(8, Some(0)) < gather);
    }

    #[test]
    fn an_adaptive_reactor_spins_only_while_its_spin_catches_requests() {
        let spin = 50_000;
        let mut w = Waiter::new(
            PollMode::Adaptive,
            Duration::from_nanos(spin),
            Duration::ZERO,
            0,
        );
        let mut now = 0;
        let mut receive_after = |w: &mut Waiter, gap: Nanos| {
            now += gap;
            w.on_completions(now, true, true);
            w.on_turn(now, 1);
            w.polling(now)
        };
        // Requests close together (QD 1 on loopback): it spins.
        assert!((0..20).all(|_| receive_after(&mut w, spin / 2)));
        // One late request (after a pause) does not stop it.
        assert!(receive_after(&mut w, 10 * spin));
        // Requests that keep coming later than the spin lasts do.
        assert!(!(0..10).all(|_| receive_after(&mut w, 2 * spin)));
        assert!(!receive_after(&mut w, 2 * spin));
        // Close together again: it spins again.
        assert!((0..10).any(|_| receive_after(&mut w, spin / 2)));
        assert!(receive_after(&mut w, spin / 2));
    }

    #[test]
    fn only_a_busy_reactor_without_payload_gathers() {
        // One request a turn (QD 1) is answered at once.
        assert_eq!(gather_wait(20, 1, 28, None), None);
        assert_eq!(gather_wait(20, 8, 8 * 28, None), Some(20));
        // Streaming payload: the client's socket buffer must keep draining.
        assert_eq!(gather_wait(20, 8, 64 << 10, None), None);
        // Off, or polling (a zero wait).
        assert_eq!(gather_wait(0, 8, 0, None), None);
        assert_eq!(gather_wait(20, 8, 0, Some(0)), None);
        // A pacer deadline 5 us away caps it; a later one does not.
        assert_eq!(gather_wait(20, 8, 0, Some(5_500)), Some(5));
        assert_eq!(gather_wait(20, 8, 0, Some(1_000_000)), Some(20));
    }
}
