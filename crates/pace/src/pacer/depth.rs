//! `auto`'s depth: how many times its windows the pipeline wants in flight.
//!
//! A window of gain x rate x min latency fills a pipe: a link, or a device
//! with a fixed number of channels, whose rate stops rising once that many
//! bytes are in flight. A disk whose rate keeps rising with its queue (a
//! cloud volume, an SSD that spreads a deep queue over its dies) is no such
//! pipe: this machine's disk read 128 KiB at ~900 MiB/s with 4 in flight and
//! ~1,500 with 28, and `auto` held it at 4. So `auto` also climbs the rate
//! response: it alternates epochs at its depth with trial epochs at one step
//! more (or, after a trial up fails, one step less), and keeps a step up
//! only if the trial delivered `GROW_MIN` more, a step down only if it lost
//! less than `SHRINK_LOSS`. On a pipe, a trial up gains nothing and the depth
//! stays 1; failed trials back off, so they cost little.
//!
//! Depth buys bandwidth with latency: IOs wait at the device behind the
//! deeper queue. While a client sends one IO at a time to a device (a QD 1
//! reader, a latency probe), that device's windows keep depth 1 and its
//! completions teach nothing: beside 128 KiB writes at depth 5-8 on this
//! machine's disk, a QD 1 reader's p99 went from 0.33-0.38 ms to 2.8-3.1
//! ms. The learned depth comes back `LONE_HOLD_NS` after the last such IO.
//! The hold is the device's alone (a QD 1 client of a RAM disk held a disk
//! writer beside it at depth 1, 1.3 GB/s against 1.8), and a lone IO's own
//! completion is no sample: its client, not the window, sets its rate, and
//! at tens of thousands a second such completions outvoted the writer's
//! backlogged ones.
//!
//! One depth serves the whole target, learned from every reactor's
//! completions ([`SharedDepth`]): a reactor alone would win its trials by
//! taking a larger part of a link it shares with the others (in the
//! simulator, reactors' depths climbed on links that were full).
//!
//! Only epochs where IO waited in the pacer count (otherwise the window did
//! not bound the rate), whose IOs spent most of their time at their devices
//! (otherwise a link or a socket bounds the rate, and more in flight only
//! queues replies: in the simulator, trials there grew the windows on links
//! by chance and doubled bytes in flight), and none that overlap a latency
//! probe. A write piece receiving its payload counts as waiting: its
//! connection's next request is read only after it. Base epochs and trials
//! up count if IO waited at most completions (a connection's writes leave
//! gaps of a few us between a payload and the next header, and some
//! completion falls into one in nearly every epoch: `auto` writes to this
//! machine's disk never left depth 1); a trial down counts only if IO
//! waited at every completion, since where the window does not bound the
//! rate, a step down loses nothing and would pass (a rule of "most
//! completions" for all of them took 128 KiB reads from 1,085 to 860-980
//! MiB/s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::fair::DEVICE_BOUND_SHARE;
use crate::Nanos;

/// An epoch lasts at least this long (a disk's rate is noisy: this one's
/// 10 ms samples of 128 KiB reads varied 12%)...
const DEPTH_EPOCH_NS: Nanos = 20_000_000;
/// ...and at least this many completions.
const EPOCH_IOS: u64 = 32;
/// Base epochs and trials up count if at least this part of their
/// completions found IO waiting.
const BACKLOGGED_MOST: f64 = 0.5;
/// One depth step: large enough that a disk's response stands above the
/// noise (this one: 4 to 8 in flight +27%, 4 to 5 a few %).
const STEP: f64 = 1.5;
/// A trial up is kept if it delivered this much more than the base epoch.
const GROW_MIN: f64 = 0.06;
/// A trial down is kept if it delivered no less than this much less.
const SHRINK_LOSS: f64 = 0.03;
/// The most depth: 1.5^7, about 17.
const MAX_STEPS: i32 = 7;
/// Base epochs before the first trial, and after a failed trial, twice
/// as many as after the last, up to `MAX_BACKOFF`: on a pipe, where trials
/// only queue more, they soon take under 2% of the time. (The first trials
/// cost the simulator's 150 ms runs up to 7% of their bandwidth.)
const FIRST_WAIT: u32 = 4;
/// A device's depth stays 1 this long after an IO that found its client
/// with nothing else queued or in flight: five epochs, many of a QD 1
/// client's IOs.
const LONE_HOLD_NS: Nanos = 100_000_000;
const MAX_BACKOFF: u32 = 64;

/// What an epoch runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// The learned depth, to measure the base rate.
    Base,
    /// One step more.
    Up,
    /// One step less.
    Down,
}

#[derive(Debug, Clone)]
pub(super) struct Depth {
    /// The learned depth is `STEP^steps`.
    steps: i32,
    run: Run,
    start: Nanos,
    /// Bytes delivered in all, and when the epoch started.
    delivered: u64,
    start_delivered: u64,
    ios: u64,
    /// The epoch's IOs' release-to-done time, and their time at devices.
    held: Nanos,
    at_device: Nanos,
    /// The epoch's completions that found IO waiting.
    backlogged: u64,
    /// A latency probe ran during the epoch, or a lone client held a
    /// device at depth 1.
    probed: bool,
    base_rate: Option<f64>,
    /// Base epochs still to run before the next trial.
    wait: u32,
    /// Base epochs to wait after the next failed trial.
    backoff: u32,
    /// The last trial up failed: the next trial goes down.
    up_failed: bool,
}

impl Default for Depth {
    fn default() -> Self {
        Depth {
            steps: 0,
            run: Run::Base,
            start: 0,
            delivered: 0,
            start_delivered: 0,
            ios: 0,
            held: 0,
            at_device: 0,
            backlogged: 0,
            probed: false,
            base_rate: None,
            wait: FIRST_WAIT,
            backoff: FIRST_WAIT,
            up_failed: false,
        }
    }
}

/// How an epoch's IO waited in the pacer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backlog {
    /// At every completion.
    Always,
    /// At `BACKLOGGED_MOST` of them or more.
    Mostly,
}

/// What the pacer knew at one completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub now: Nanos,
    /// Bytes the IO delivered.
    pub bytes: u64,
    /// The IO's release-to-done time, and its time at its device.
    pub held: Nanos,
    pub at_device: Nanos,
    /// IO is waiting in the pacer, or a write piece for its payload (the
    /// windows bound the rate).
    pub backlogged: bool,
    /// A latency probe holds the window down.
    pub probing: bool,
    /// The IO found its client with nothing else queued or in flight.
    pub lone: bool,
    /// A lone client holds the IO's device at depth 1.
    pub device_held: bool,
}

impl Depth {
    /// The factor the windows take now: the learned depth, or a trial's.
    pub fn factor(&self) -> f64 {
        let steps = match self.run {
            Run::Base => self.steps,
            Run::Up => self.steps + 1,
            Run::Down => self.steps - 1,
        };
        STEP.powi(steps)
    }

    /// The learned depth, without a trial's step.
    pub fn learned(&self) -> f64 {
        STEP.powi(self.steps)
    }

    fn factors(&self) -> Factors {
        Factors {
            now: self.factor(),
            learned: self.learned(),
        }
    }

    /// One IO completed.
    pub fn completed(&mut self, s: Sample) {
        if s.lone {
            return;
        }
        self.backlogged += u64::from(s.backlogged);
        // Epochs with a device at depth 1 for a lone client teach nothing.
        self.probed |= s.probing || s.device_held;
        self.delivered += s.bytes;
        self.ios += 1;
        self.held += s.held;
        self.at_device += s.at_device;
        if s.now < self.start + DEPTH_EPOCH_NS || self.ios < EPOCH_IOS {
            return;
        }
        let rate = (self.delivered - self.start_delivered) as f64 / (s.now - self.start) as f64;
        if let Some(backlog) = self.backlog() {
            self.end_epoch(rate, backlog);
        }
        self.start_epoch(s);
    }

    fn start_epoch(&mut self, s: Sample) {
        self.start = s.now;
        self.start_delivered = self.delivered;
        self.ios = 0;
        (self.held, self.at_device) = (0, 0);
        self.backlogged = 0;
        self.probed = false;
    }

    /// How the epoch's IO waited, if it teaches anything.
    fn backlog(&self) -> Option<Backlog> {
        let device_bound = self.at_device as f64 >= DEVICE_BOUND_SHARE * self.held as f64;
        if self.probed || !device_bound {
            return None;
        }
        if self.backlogged == self.ios {
            Some(Backlog::Always)
        } else if self.backlogged as f64 >= BACKLOGGED_MOST * self.ios as f64 {
            Some(Backlog::Mostly)
        } else {
            None
        }
    }

    /// An epoch that counts ended with `rate`: decides the next one.
    fn end_epoch(&mut self, rate: f64, backlog: Backlog) {
        match (self.run, self.base_rate) {
            (Run::Base, _) => {
                self.base_rate = Some(rate);
                if self.wait > 0 {
                    self.wait -= 1;
                } else if self.up_failed && self.steps > 0 {
                    self.run = Run::Down;
                } else if self.steps < MAX_STEPS {
                    self.run = Run::Up;
                }
            }
            (Run::Up, Some(base)) => {
                let kept = rate >= base * (1.0 + GROW_MIN);
                self.steps += i32::from(kept);
                self.trial_done(kept, !kept);
            }
            (Run::Down, Some(base)) => {
                let kept = backlog == Backlog::Always && rate >= base * (1.0 - SHRINK_LOSS);
                self.steps -= i32::from(kept);
                self.trial_done(kept, false);
            }
            (_, None) => self.run = Run::Base,
        }
    }

    /// Back to a base epoch after a trial: a kept step is tried further
    /// at once; a failed one waits longer each time.
    fn trial_done(&mut self, kept: bool, up_failed: bool) {
        self.run = Run::Base;
        self.base_rate = None;
        self.up_failed = up_failed;
        if kept {
            self.backoff = 1;
            self.wait = 0;
        } else {
            self.wait = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Forgets what was learned (a new configuration).
    pub fn reset(&mut self) {
        *self = Depth::default();
    }
}

/// The factors in effect: a trial's, and the learned one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Factors {
    pub now: f64,
    pub learned: f64,
}

impl Default for Factors {
    fn default() -> Self {
        Factors {
            now: 1.0,
            learned: 1.0,
        }
    }
}

/// One target's depth, shared by its reactors' pacers, and when each
/// device last had an IO from a lone client.
#[derive(Debug, Default)]
pub struct SharedDepth {
    depth: Mutex<Depth>,
    /// Per device: 0, or the time of its last lone IO (at least 1).
    lone_at: Box<[AtomicU64]>,
}

impl SharedDepth {
    pub fn new(devices: usize) -> Arc<SharedDepth> {
        Arc::new(SharedDepth {
            depth: Mutex::default(),
            lone_at: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn depth(&self) -> std::sync::MutexGuard<'_, Depth> {
        // A reactor that panicked holding it left a consistent value.
        self.depth.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One IO completed on some reactor; the factors after it.
    pub(super) fn completed(&self, s: Sample) -> Factors {
        let mut d = self.depth();
        d.completed(s);
        d.factors()
    }

    pub(super) fn factors(&self) -> Factors {
        self.depth().factors()
    }

    /// An IO for device `d` arrived from a client with nothing else queued
    /// or in flight.
    pub(super) fn lone_io(&self, d: usize, now: Nanos) {
        if let Some(t) = self.lone_at.get(d) {
            t.fetch_max(now.max(1), Ordering::Relaxed);
        }
    }

    /// Device `d` keeps depth 1 at `now` for a lone client.
    pub(super) fn held(&self, d: usize, now: Nanos) -> bool {
        let t = self.lone_at.get(d).map_or(0, |t| t.load(Ordering::Relaxed));
        t != 0 && now < t + LONE_HOLD_NS
    }

    pub(super) fn reset(&self) {
        self.depth().reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completion at `now` of `bytes`, held 100 us, 90 of them at its
    /// device.
    fn sample(now: Nanos, bytes: u64, backlogged: bool) -> Sample {
        Sample {
            now,
            bytes,
            held: 100_000,
            at_device: 90_000,
            backlogged,
            probing: false,
            lone: false,
            device_held: false,
        }
    }

    /// A device whose rate at depth factor `f` is `rate(f)` bytes per ns,
    /// one completion every 100 us, always backlogged.
    #[derive(Default)]
    struct Rig {
        depth: Depth,
        now: Nanos,
    }

    impl Rig {
        fn drive(&mut self, ms: u64, rate: impl Fn(f64) -> f64) {
            let step = 100_000;
            for _ in 0..ms * 10 {
                self.now += step;
                let bytes = (rate(self.depth.factor()) * step as f64) as u64;
                self.depth.completed(sample(self.now, bytes, true));
            }
        }
    }

    /// A rig that has climbed for 5 s on a device whose rate grows with
    /// depth up to 8.
    fn climbed() -> Rig {
        let mut rig = Rig::default();
        rig.drive(5_000, |f| f.min(8.0));
        let learned = rig.depth.learned();
        assert!(learned >= 7.0, "climbed to {learned}");
        rig
    }

    #[test]
    fn epochs_beside_a_held_device_teach_nothing() {
        let mut rig = climbed();
        let learned = rig.depth.learned();
        // A second of completions at depth 1, from a device a lone client
        // holds there: were they counted, trials down would pass.
        for _ in 0..5_000 {
            rig.now += 200_000;
            let s = Sample {
                device_held: true,
                ..sample(rig.now, 100_000, true)
            };
            rig.depth.completed(s);
        }
        assert_eq!(rig.depth.learned(), learned);
    }

    #[test]
    fn a_lone_clients_completions_do_not_outvote_a_backlogged_writer() {
        // Two of every three completions are a QD 1 client's, with nothing
        // waiting: counted, a third of the epoch's completions were
        // backlogged, and none of its epochs would teach.
        let mut rig = Rig::default();
        let step = 100_000;
        for _ in 0..50_000 {
            rig.now += step;
            let bytes = (rig.depth.factor().min(8.0) * step as f64) as u64;
            rig.depth.completed(sample(rig.now, bytes, true));
            let lone = Sample {
                lone: true,
                ..sample(rig.now, 4096, false)
            };
            rig.depth.completed(lone);
            rig.depth.completed(lone);
        }
        assert!(rig.depth.learned() >= 7.0, "{}", rig.depth.learned());
    }

    #[test]
    fn a_lone_client_holds_its_own_device_for_a_while() {
        let shared = SharedDepth::new(2);
        assert!(!shared.held(0, 0) && !shared.held(1, 0));
        shared.lone_io(1, 5_000);
        assert!(shared.held(1, 5_000) && shared.held(1, 5_000 + LONE_HOLD_NS - 1));
        assert!(!shared.held(0, 5_000), "the other device keeps its depth");
        assert!(!shared.held(1, 5_000 + LONE_HOLD_NS));
        // A device the pacer never heard of is never held.
        shared.lone_io(7, 5_000);
        assert!(!shared.held(7, 5_000));
    }

    #[test]
    fn a_pipe_stays_at_depth_one() {
        let mut rig = Rig::default();
        rig.drive(5_000, |_| 1.0);
        assert_eq!(rig.depth.learned(), 1.0);
    }

    #[test]
    fn a_disk_whose_rate_grows_with_queue_climbs_to_its_knee() {
        // Rate = max x W / (W + B) with W = 4 x depth IOs and B = 3.4 IOs:
        // doubling W gains 10% at 32 IOs (90% of max), 5% at 64.
        let mut rig = Rig::default();
        rig.drive(5_000, |f| {
            let w = 4.0 * f;
            w / (w + 3.4)
        });
        let w = 4.0 * rig.depth.learned();
        assert!((16.0..=32.0).contains(&w), "stopped at {w} IOs");
    }

    #[test]
    fn it_comes_back_down_when_the_gain_goes() {
        let mut rig = climbed();
        rig.drive(20_000, |_| 1.0);
        let stayed = rig.depth.learned();
        assert!(stayed <= 1.6, "stayed at {stayed}");
    }

    /// The depth learned in 5 s where the rate doubles with depth, and
    /// every IO is held 100 us, `at_device` of it at its device.
    fn learned_where_depth_pays(at_device: Nanos, backlogged: impl Fn(u64) -> bool) -> f64 {
        let mut d = Depth::default();
        for i in 1..=50_000u64 {
            let bytes = (d.factor() * 1e5) as u64;
            d.completed(Sample {
                at_device,
                ..sample(i * 100_000, bytes, backlogged(i))
            });
        }
        d.learned()
    }

    #[test]
    fn epochs_whose_ios_wait_on_their_links_teach_nothing() {
        // 90% of their time after their devices: sending, not reading.
        assert_eq!(learned_where_depth_pays(10_000, |_| true), 1.0);
        // The same rate response, at the devices: it climbs.
        assert!(learned_where_depth_pays(90_000, |_| true) > 1.0);
    }

    #[test]
    fn epochs_without_backlog_teach_nothing() {
        // The pacer is never backlogged: the window is not what bounds it.
        assert_eq!(learned_where_depth_pays(90_000, |_| false), 1.0);
        // Nor with IO waiting at only a third of the completions.
        assert_eq!(learned_where_depth_pays(90_000, |i| i % 3 == 0), 1.0);
    }

    #[test]
    fn a_writer_whose_completions_sometimes_find_nothing_waiting_climbs() {
        // One completion in ten falls between a payload and the next
        // header: base epochs and trials up still count.
        assert!(learned_where_depth_pays(90_000, |i| i % 10 != 0) > 1.0);
    }

    #[test]
    fn a_step_down_needs_io_waiting_at_every_completion() {
        // The rate does not depend on depth: where IO waited at every
        // completion, the trials down take it back to 1 once trials up
        // fail; where some completion found none waiting (the window may
        // not bound the rate), the trials down are not kept.
        let climbed = |backlogged: fn(u64) -> bool| {
            let mut d = Depth {
                steps: 3,
                ..Depth::default()
            };
            for i in 1..=200_000u64 {
                d.completed(sample(i * 100_000, 100_000, backlogged(i)));
            }
            d.learned()
        };
        assert_eq!(climbed(|_| true), 1.0);
        assert_eq!(climbed(|i| i % 10 != 0), STEP.powi(3));
    }
}
