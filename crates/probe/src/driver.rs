//! The load generator: closed loops of IO on iopace's own bdev path, in
//! process. Each worker thread prepares IO as a reactor does, submits a file
//! leaf's SQEs to its own io_uring, and holds completions of delay and model
//! bdevs on a timer heap, so a probe sees what the target would.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bdev::{Bdev, IoOp, IoRequest, IoResult, Prep};
use hdrhistogram::Histogram;
use io_uring::{types, IoUring};
use pace::pacer::IoKind;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::converge::{mean_and_rel_ci, median, verdict, StopRule, Verdict};

/// The shape of the IO a point issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Percent of IOs that read; the rest write.
    pub read_pct: u32,
    pub bs: u32,
    pub random: bool,
    /// Half the IOs are this size instead of `bs` (fio's `bssplit=4k/50:64k/50`).
    #[serde(default)]
    pub alt_bs: Option<u32>,
}

impl Workload {
    /// The largest IO: what a slot's buffer holds and offsets align to.
    pub fn max_bs(&self) -> u32 {
        self.alt_bs.map_or(self.bs, |a| a.max(self.bs))
    }

    /// The mean IO size.
    pub fn mean_bs(&self) -> f64 {
        self.alt_bs.map_or(f64::from(self.bs), |a| {
            (f64::from(a) + f64::from(self.bs)) / 2.0
        })
    }

    /// The IO sizes, each issued equally often.
    pub fn sizes(&self) -> Vec<u32> {
        std::iter::once(self.bs).chain(self.alt_bs).collect()
    }
}

/// How a point's IOPS is taken from what it saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RateBasis {
    /// Completions a second: what a real device gave.
    #[default]
    Completions,
    /// IOs in flight over the median latency (Little's law for the typical
    /// IO), for timer-paced devices (`model`, `delay`): their hold time is
    /// exact, so the probe's own descheduling on a busy machine, which
    /// lowers the completion rate but not the median, is left out.
    QdOverMedian,
}

/// One worker thread: a device, the IOs it keeps in flight there, their
/// shape, and optionally a budget of device time it may use.
#[derive(Clone)]
pub struct Job {
    pub dev: Arc<Bdev>,
    pub qd: u32,
    pub workload: Workload,
    pub throttle: Option<Throttle>,
}

/// iocost's budget: every IO costs its device time under `cost`, and the
/// job may spend `vrate` (1.0: the model's full rate) device-seconds a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    pub cost: pace::pacer::CostModel,
    pub vrate: f64,
}

/// What one job of a point did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobStats {
    /// Completions per second: the median of the windows.
    pub rate: f64,
    pub bytes_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// What a point measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    /// The point's IOPS, by `basis`.
    pub iops: f64,
    #[serde(default)]
    pub basis: RateBasis,
    /// The median of the per-window completion rates.
    pub window_iops: f64,
    pub mean_us: f64,
    pub bytes_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Relative half-width of the 95% interval of the window rates.
    pub rel_ci: f64,
    pub converged: bool,
    pub secs: f64,
}

/// Counters the workers share with the thread that times the windows.
#[derive(Default)]
struct Shared {
    /// Per job, completions.
    measured: Vec<AtomicU64>,
    errors: AtomicU64,
    /// Workers set up (buffers, ring) and issuing.
    ready: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
}

/// Runs `w` on every device of `jobs` at once until `rule` stops it.
pub fn measure(jobs: &[Job], w: &Workload, rule: &StopRule) -> Result<Measurement, String> {
    let jobs: Vec<Job> = jobs
        .iter()
        .map(|j| Job {
            workload: *w,
            ..j.clone()
        })
        .collect();
    Ok(measure_jobs(&jobs, rule)?.0)
}

/// Runs every job at once until `rule` stops it: the whole, and each job.
pub fn measure_jobs(jobs: &[Job], rule: &StopRule) -> Result<(Measurement, Vec<JobStats>), String> {
    let shared = Shared {
        measured: jobs.iter().map(|_| AtomicU64::new(0)).collect(),
        ..Shared::default()
    };
    let w = &jobs.first().ok_or("no jobs")?.workload;
    let (windows, hist, per_job) = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                let shared = &shared;
                scope.spawn(move || {
                    let r = Worker::new(job, i, jobs.len(), shared).and_then(Worker::run);
                    if r.is_err() {
                        // The windows stop at once.
                        shared.errors.fetch_add(1, Ordering::AcqRel);
                    }
                    r
                })
            })
            .collect();
        let windows = time_windows(&shared, rule, jobs.len() as u64);
        shared.stop.store(true, Ordering::Release);
        let mut hist = new_histogram();
        let mut per_job = Vec::new();
        for (i, h) in handles.into_iter().enumerate() {
            let part = h
                .join()
                .map_err(|_| "a probe worker panicked".to_string())??;
            hist.add(&part).map_err(|e| e.to_string())?;
            per_job.push(JobStats::of(&jobs[i], &windows.per_job[i], &part));
        }
        Ok::<_, String>((windows, hist, per_job))
    })?;
    let errors = shared.errors.load(Ordering::Acquire);
    if errors > 0 {
        return Err(format!("{errors} IOs failed"));
    }
    let (completions, rel_ci) = mean_and_rel_ci(&windows.all);
    let p50_us = hist.value_at_quantile(0.5) as f64 / 1000.0;
    let in_flight: u32 = jobs.iter().map(|j| j.qd).sum();
    let basis = if jobs.iter().all(|j| j.dev.has_delay()) {
        RateBasis::QdOverMedian
    } else {
        RateBasis::Completions
    };
    let iops = match basis {
        RateBasis::Completions => completions,
        RateBasis::QdOverMedian => f64::from(in_flight) * 1e6 / p50_us.max(1e-3),
    };
    let m = Measurement {
        iops,
        basis,
        window_iops: median(&windows.all),
        mean_us: hist.mean() / 1000.0,
        bytes_per_s: iops * w.mean_bs(),
        p50_us,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rel_ci,
        converged: rel_ci <= rule.ci,
        secs: windows.secs,
    };
    Ok((m, per_job))
}

impl JobStats {
    /// Job `job`'s stats from its windows' rates and its latencies.
    fn of(job: &Job, window_rates: &[f64], hist: &Histogram<u64>) -> JobStats {
        // The median window: robust to the probe being descheduled.
        let rate = median(window_rates);
        JobStats {
            rate,
            bytes_per_s: rate * job.workload.mean_bs(),
            p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        }
    }
}

/// Samples the completion rate once a window until the rule stops the point.
/// Per-window completion rates: of all jobs, and of each job.
#[derive(Default)]
struct Windows {
    all: Vec<f64>,
    per_job: Vec<Vec<f64>>,
    secs: f64,
}

fn time_windows(shared: &Shared, rule: &StopRule, workers: u64) -> Windows {
    let mut w = Windows {
        per_job: vec![Vec::new(); shared.measured.len()],
        ..Windows::default()
    };
    // Setting up a worker (buffers, ring) is no part of the point.
    while shared.ready.load(Ordering::Acquire) < workers {
        if shared.errors.load(Ordering::Acquire) > 0 {
            return w;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(rule.warmup);
    shared.measuring.store(true, Ordering::Release);
    let start = Instant::now();
    let counts = || -> Vec<u64> {
        shared
            .measured
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .collect()
    };
    let mut last = (start, counts());
    loop {
        std::thread::sleep(rule.window);
        let now = Instant::now();
        let done = counts();
        let dt = now.duration_since(last.0).as_secs_f64();
        for (i, (d, l)) in done.iter().zip(&last.1).enumerate() {
            w.per_job[i].push((d - l) as f64 / dt);
        }
        w.all
            .push(done.iter().zip(&last.1).map(|(d, l)| d - l).sum::<u64>() as f64 / dt);
        last = (now, done);
        w.secs = now.duration_since(start).as_secs_f64();
        let stop = verdict(&w.all, now.duration_since(start), rule) != Verdict::Continue;
        if stop || shared.errors.load(Ordering::Acquire) > 0 {
            return w;
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// IO buffers, 4 KiB aligned for O_DIRECT.
struct Buffers {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Buffers {
    fn new(len: usize) -> Result<Buffers, String> {
        let layout =
            std::alloc::Layout::from_size_align(len.max(4096), 4096).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes of buffers"));
        }
        // Writes carry non-zero data, so devices that compress or dedupe zeros don't flatter.
        let mut rng = SmallRng::seed_from_u64(len as u64);
        // SAFETY: ptr is valid for layout.size() bytes.
        rng.fill(unsafe { std::slice::from_raw_parts_mut(ptr, layout.size()) });
        Ok(Buffers { ptr, layout })
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Where an IO of a slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Its SQEs are in the ring; an earlier SQE of the chain may have failed.
    InRing {
        chain_error: Option<IoResult>,
    },
    /// Done at the device, held until its release time.
    Held,
}

struct Slot {
    iov: libc::iovec,
    op: IoOp,
    offset: u64,
    t_submit: u64,
    /// Issued after warm-up: its latency counts (the queue was already full).
    measured: bool,
    state: SlotState,
}

const LAST_SQE: u64 = 1 << 32;

/// Wall time of budget a throttled job may bank while it waits
/// (descheduled, or all its IOs in flight): what the server's QoS budget
/// banks at `vrate` ([`pace::pacer::qos_burst_ns`], in cost-model time), so
/// tune measures the budget the solution is applied with. (It banked 50 ms
/// before: after each stall of the disk the adversary sent its whole QD at
/// once, and the QD 1 probe's p99 behind that burst was 2.7-6.6x solo at
/// every vrate down to 40%, while the server's budget lets ~10 IOs through.)
fn catch_up_ns(vrate: f64) -> f64 {
    pace::pacer::qos_burst_ns(vrate) / vrate
}

struct Worker<'a> {
    dev: &'a Bdev,
    w: Workload,
    throttle: Option<Throttle>,
    /// Throttled jobs: when the budget allows the next IO (virtual time).
    next_issue_ns: f64,
    index: usize,
    shared: &'a Shared,
    ring: IoUring,
    _buffers: Buffers,
    slots: Box<[Slot]>,
    free: Vec<u32>,
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    rng: SmallRng,
    origin: Instant,
    /// Sequential streams: where the next IO starts, and the stream's range.
    cursor: u64,
    range: (u64, u64),
    hist: Histogram<u64>,
    in_ring: u32,
}

impl<'a> Worker<'a> {
    fn new(
        job: &'a Job,
        index: usize,
        workers: usize,
        shared: &'a Shared,
    ) -> Result<Worker<'a>, String> {
        let w = &job.workload;
        let bs = u64::from(w.max_bs());
        let size = job.dev.size() / bs * bs;
        if size < bs || job.qd == 0 {
            return Err(format!("{}: too small for {bs} B IOs", job.dev.name()));
        }
        // Sequential streams of different workers start apart, so each stays sequential.
        let share = (size / workers as u64 / bs).max(1) * bs;
        let start = (share * index as u64).min(size - bs);
        let buffers = Buffers::new(job.qd as usize * bs as usize)?;
        let slots: Box<[Slot]> = (0..job.qd as usize)
            .map(|i| Slot {
                iov: libc::iovec {
                    // SAFETY: inside the buffer allocation of qd * bs bytes.
                    iov_base: unsafe { buffers.ptr.add(i * bs as usize) }.cast(),
                    iov_len: w.bs as usize,
                },
                op: IoOp::Read,
                offset: 0,
                t_submit: 0,
                measured: false,
                state: SlotState::Free,
            })
            .collect();
        let ring = IoUring::new((job.qd * 2).next_power_of_two().clamp(64, 4096))
            .map_err(|e| format!("io_uring: {e}"))?;
        Ok(Worker {
            dev: &job.dev,
            w: *w,
            throttle: job.throttle,
            next_issue_ns: 0.0,
            index,
            shared,
            ring,
            _buffers: buffers,
            slots,
            free: (0..job.qd).rev().collect(),
            timers: BinaryHeap::new(),
            rng: SmallRng::seed_from_u64(0x9e37_79b9 ^ index as u64),
            origin: Instant::now(),
            cursor: start,
            range: (start, (start + share).min(size)),
            hist: new_histogram(),
            in_ring: 0,
        })
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn run(mut self) -> Result<Histogram<u64>, String> {
        let mut cqes: Vec<(u64, i32)> = Vec::new();
        self.shared.ready.fetch_add(1, Ordering::AcqRel);
        loop {
            let now = self.now();
            self.fire_timers(now);
            let stopping = self.shared.stop.load(Ordering::Acquire);
            if stopping && self.in_ring == 0 && self.timers.is_empty() {
                return Ok(self.hist);
            }
            if !stopping {
                while self.may_issue(now) {
                    let Some(slot) = self.free.pop() else { break };
                    self.issue(slot)?;
                }
            }
            self.wait(now)?;
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(ud, res) in &cqes {
                self.on_cqe(ud, res);
            }
        }
    }

    /// Whether the budget allows another IO now; charges it if so.
    fn may_issue(&mut self, now: u64) -> bool {
        if self.free.is_empty() {
            return false;
        }
        let Some(t) = self.throttle else { return true };
        if self.next_issue_ns > now as f64 {
            return false;
        }
        let kind = if self.w.read_pct >= 50 {
            IoKind::Read
        } else {
            IoKind::Write
        };
        let cost = t.cost.cost(kind, self.w.bs, !self.w.random) / t.vrate.max(1e-6);
        let bank = catch_up_ns(t.vrate.max(1e-6));
        self.next_issue_ns = self.next_issue_ns.max(now as f64 - bank) + cost;
        true
    }

    /// Waits for a completion or the next timer, at most 10 ms (to see `stop`).
    fn wait(&mut self, now: u64) -> Result<(), String> {
        let budget = (self.throttle.is_some() && !self.free.is_empty())
            .then_some(self.next_issue_ns.ceil() as u64);
        let deadline = self.timers.peek().map(|Reverse((t, _))| *t);
        let deadline = match (deadline, budget) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let wait = deadline.map_or(10_000_000, |t| t.saturating_sub(now).min(10_000_000));
        if self.in_ring == 0 && wait < 20_000 {
            // Sleeping costs more than this; spin.
            while self.now() < now + wait {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if self.in_ring == 0 && deadline.is_none() {
            return Ok(());
        }
        let ts = types::Timespec::from(Duration::from_nanos(wait.max(1_000)));
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(format!("io_uring wait: {e}")),
        }
    }

    fn next_offset(&mut self, bs: u32) -> u64 {
        let bs = u64::from(bs);
        let (lo, hi) = self.range;
        if self.w.random {
            lo + self.rng.gen_range(0..(hi - lo) / bs) * bs
        } else {
            if self.cursor + bs > hi {
                self.cursor = lo;
            }
            let at = self.cursor;
            self.cursor += bs;
            at
        }
    }

    fn issue(&mut self, slot: u32) -> Result<(), String> {
        let write = self.rng.gen_range(0..100) >= self.w.read_pct;
        let op = if write {
            IoOp::Write { fua: false }
        } else {
            IoOp::Read
        };
        let bs = match self.w.alt_bs {
            Some(alt) if self.rng.gen_bool(0.5) => alt,
            _ => self.w.bs,
        };
        let offset = self.next_offset(bs);
        let now = self.now();
        let measured = self.shared.measuring.load(Ordering::Relaxed);
        let s = &mut self.slots[slot as usize];
        (s.op, s.offset, s.t_submit, s.measured) = (op, offset, now, measured);
        s.iov.iov_len = bs as usize;
        let io = request(s);
        // SAFETY: the iovec points at this worker's buffer for the slot,
        // which lives (unmoved) until the worker ends after its last IO.
        match unsafe { self.dev.prepare(&io) } {
            Prep::Done(result) => self.device_done(slot, result, now),
            Prep::Sqes(sqes) => {
                let last = sqes.len() - 1;
                self.slots[slot as usize].state = SlotState::InRing { chain_error: None };
                self.in_ring += 1;
                for (i, sqe) in sqes.into_iter().enumerate() {
                    let tag = if i == last { LAST_SQE } else { 0 };
                    self.push(sqe.user_data(u64::from(slot) | tag))?;
                }
            }
        }
        Ok(())
    }

    fn push(&mut self, sqe: io_uring::squeue::Entry) -> Result<(), String> {
        loop {
            // SAFETY: the SQE points at a slot buffer that outlives its completion.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.ring
                .submit()
                .map_err(|e| format!("io_uring submit: {e}"))?;
        }
    }

    fn on_cqe(&mut self, ud: u64, res: i32) {
        let slot = (ud & 0xffff_ffff) as u32;
        let s = &self.slots[slot as usize];
        let io = request(s);
        let SlotState::InRing { chain_error } = s.state else {
            debug_assert!(false, "a completion for a slot not in the ring");
            return;
        };
        if ud & LAST_SQE == 0 {
            // Not the chain's last: only its first error matters.
            let e = self.dev.complete(&io, res);
            if chain_error.is_none() && e != IoResult::Ok {
                self.slots[slot as usize].state = SlotState::InRing {
                    chain_error: Some(e),
                };
            }
            return;
        }
        let result = chain_error.unwrap_or_else(|| self.dev.complete(&io, res));
        self.in_ring -= 1;
        let now = self.now();
        self.device_done(slot, result, now);
    }

    /// The device has the IO done; a delay or model bdev holds it a while.
    fn device_done(&mut self, slot: u32, result: IoResult, now: u64) {
        if let IoResult::Err(_) = result {
            self.shared.errors.fetch_add(1, Ordering::AcqRel);
        }
        let s = &mut self.slots[slot as usize];
        if self.dev.has_delay() {
            let release = s.t_submit + self.dev.sample_delay_ns(s.op, &mut self.rng);
            if release > now {
                s.state = SlotState::Held;
                self.timers.push(Reverse((release, slot)));
                return;
            }
        }
        self.finish(slot, now);
    }

    fn fire_timers(&mut self, now: u64) {
        while let Some(&Reverse((t, slot))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            debug_assert_eq!(self.slots[slot as usize].state, SlotState::Held);
            self.finish(slot, now);
        }
    }

    fn finish(&mut self, slot: u32, now: u64) {
        let s = &mut self.slots[slot as usize];
        s.state = SlotState::Free;
        self.shared.measured[self.index].fetch_add(1, Ordering::AcqRel);
        if s.measured {
            let _ = self.hist.record((now - s.t_submit).max(1));
        }
        self.free.push(slot);
    }
}

fn request(s: &Slot) -> IoRequest {
    IoRequest {
        op: s.op,
        offset: s.offset,
        len: s.iov.iov_len as u32,
        iov: &s.iov,
        iovcnt: 1,
    }
}
