//! Whether a busy reactor's waits gather completions, decided by trying
//! both. A gathering wait saves wake-ups and syscalls per IO, but clients
//! keep a fixed number of requests outstanding, so it also lengthens every
//! round trip. Where a client waits on the target (a fast local client at
//! QD 32), that costs IOPS in proportion: 4 KiB reads over Unix ran 157k
//! IOPS gathering against 222k without. Where the client is the slower
//! side (loopback TCP, deep queues) gathering costs nothing and saves a
//! third of the CPU per IO. The reactor cannot see which case it is in,
//! so it measures: every `GATHER_HOLD_NS` it serves one epoch the other way and
//! one epoch its chosen way, and keeps gathering unless not gathering
//! served clearly more in two trials in a row
//! (docs/evidence.md#gather).

use pace::Nanos;

/// How long a choice holds before the next trial. A trial runs 40 ms the
/// other way, so where gathering pays it costs about 4% of its saving.
const GATHER_HOLD_NS: Nanos = 1_000_000_000;
/// Each trial epoch. Long enough to serve thousands of requests at the
/// rates where gathering matters; short against `GATHER_HOLD_NS`, so a trial of
/// the worse way costs little.
const GATHER_EPOCH_NS: Nanos = 40_000_000;
/// The start of an epoch that is not counted: the queues the previous way
/// left behind drain or build in it.
const SETTLE_NS: Nanos = 5_000_000;
/// Requests both epochs must serve together for a verdict: below this the
/// reactor is too idle for gathering to matter, and the choice stands.
const MIN_TRIAL_REQUESTS: f64 = 500.0;
/// Not gathering wins a trial only when it serves this much more: at equal
/// rates gathering saves CPU, and one epoch's rate is noisy by several
/// percent (where gathering costs, not gathering serves 35-41% more).
const GATHER_TOLERANCE: f64 = 0.10;
/// Trials in a row not gathering must win before a reactor stops: over
/// loopback TCP, where gathering costs nothing, one epoch in ten still
/// ran 10-30% slower gathering.
const WINS_TO_STOP: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The choice runs until `GATHER_HOLD_NS` after the phase began.
    Hold,
    /// One epoch the other way.
    TryOther,
    /// One epoch the chosen way; the other way's rate, requests per second.
    TryChosen { other_rate: f64 },
}

#[derive(Debug)]
pub struct GatherTrial {
    /// The choice: gather when busy.
    chosen: bool,
    phase: Phase,
    phase_start: Nanos,
    /// Requests served in this phase since `SETTLE_NS` into it.
    served: u64,
    /// Trials in a row that not gathering won while gathering was chosen.
    wins_off: u8,
}

impl GatherTrial {
    pub fn new(now: Nanos) -> GatherTrial {
        GatherTrial {
            chosen: true,
            phase: Phase::Hold,
            phase_start: now,
            served: 0,
            wins_off: 0,
        }
    }

    /// Whether the next wait may gather.
    pub fn gathering(&self) -> bool {
        match self.phase {
            Phase::TryOther => !self.chosen,
            Phase::Hold | Phase::TryChosen { .. } => self.chosen,
        }
    }

    /// A loop turn ended at `now` having served `served` requests.
    pub fn on_turn(&mut self, now: Nanos, served: u64) {
        debug_assert!(now >= self.phase_start, "the clock went back");
        let elapsed = now - self.phase_start;
        if elapsed > SETTLE_NS {
            self.served += served;
        }
        match self.phase {
            Phase::Hold if elapsed >= GATHER_HOLD_NS => self.begin(now, Phase::TryOther),
            Phase::TryOther if elapsed >= GATHER_EPOCH_NS => {
                let other_rate = self.rate(elapsed);
                self.begin(now, Phase::TryChosen { other_rate });
            }
            Phase::TryChosen { other_rate } if elapsed >= GATHER_EPOCH_NS => {
                let chosen_rate = self.rate(elapsed);
                if (other_rate + chosen_rate) * (elapsed - SETTLE_NS) as f64 / 1e9
                    >= MIN_TRIAL_REQUESTS
                {
                    self.decide(other_rate, chosen_rate);
                }
                self.begin(now, Phase::Hold);
            }
            _ => {}
        }
    }

    fn begin(&mut self, now: Nanos, phase: Phase) {
        self.phase = phase;
        self.phase_start = now;
        self.served = 0;
    }

    /// Requests per second over the counted part of an epoch `elapsed` long.
    fn rate(&self, elapsed: Nanos) -> f64 {
        debug_assert!(elapsed > SETTLE_NS);
        self.served as f64 * 1e9 / (elapsed - SETTLE_NS) as f64
    }

    fn decide(&mut self, other_rate: f64, chosen_rate: f64) {
        let (on, off) = if self.chosen {
            (chosen_rate, other_rate)
        } else {
            (other_rate, chosen_rate)
        };
        let off_wins = off > on * (1.0 + GATHER_TOLERANCE);
        let gather = if !off_wins {
            true
        } else if self.chosen {
            self.wins_off += 1;
            self.wins_off < WINS_TO_STOP
        } else {
            false
        };
        if !off_wins || !gather {
            self.wins_off = 0;
        }
        if gather != self.chosen {
            tracing::debug!(gather, on, off, "gathering trial: requests per second");
        }
        self.chosen = gather;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `trial` for `ns` in 100 us turns, serving `rate(gathering)`
    /// requests per second.
    fn run(trial: &mut GatherTrial, now: &mut Nanos, ns: Nanos, rate: impl Fn(bool) -> f64) {
        let end = *now + ns;
        while *now < end {
            *now += 100_000;
            let served = (rate(trial.gathering()) * 1e-4) as u64;
            trial.on_turn(*now, served);
        }
    }

    #[test]
    fn stops_gathering_when_it_costs_requests_and_tries_again_later() {
        let mut now = 0;
        let mut t = GatherTrial::new(now);
        assert!(t.gathering(), "gathers until a trial says otherwise");
        let fast_client = |g: bool| if g { 157_000.0 } else { 222_000.0 };
        run(
            &mut t,
            &mut now,
            GATHER_HOLD_NS + 2 * GATHER_EPOCH_NS + 1_000_000,
            fast_client,
        );
        assert!(t.gathering(), "one trial is not enough to stop");
        run(
            &mut t,
            &mut now,
            GATHER_HOLD_NS + 2 * GATHER_EPOCH_NS,
            fast_client,
        );
        assert!(!t.gathering(), "not gathering served 41% more, twice");
        // The client changes (deeper queues): gathering no longer costs.
        let slow_client = |_: bool| 240_000.0;
        run(
            &mut t,
            &mut now,
            GATHER_HOLD_NS + 2 * GATHER_EPOCH_NS + 1_000_000,
            slow_client,
        );
        assert!(t.gathering(), "equal rates: gathering saves CPU");
    }

    #[test]
    fn keeps_gathering_within_the_tolerance_and_when_idle() {
        let mut now = 0;
        let mut t = GatherTrial::new(now);
        run(&mut t, &mut now, 3 * GATHER_HOLD_NS, |g| {
            if g {
                100_000.0
            } else {
                108_000.0
            }
        });
        assert!(t.gathering());
        // Idle with a stale choice of not gathering: a trial with too few
        // requests keeps it.
        t.chosen = false;
        run(&mut t, &mut now, 3 * GATHER_HOLD_NS, |g| {
            if g {
                0.0
            } else {
                1_000.0
            }
        });
        assert!(!t.gathering());
    }

    #[test]
    fn only_wins_in_a_row_stop_gathering() {
        let mut t = GatherTrial::new(0);
        // (other = not gathering, chosen = gathering)
        t.decide(150_000.0, 100_000.0);
        assert!(t.chosen, "one noisy trial");
        t.decide(100_000.0, 100_000.0);
        t.decide(150_000.0, 100_000.0);
        assert!(t.chosen, "a fair trial in between starts the count again");
        t.decide(150_000.0, 100_000.0);
        assert!(!t.chosen, "two in a row");
        // (other = gathering, chosen = not gathering): one fair trial is
        // enough to go back.
        t.decide(140_000.0, 150_000.0);
        assert!(t.chosen);
    }

    #[test]
    fn a_trial_runs_the_other_way_for_one_epoch() {
        let mut now = 0;
        let mut t = GatherTrial::new(now);
        run(&mut t, &mut now, GATHER_HOLD_NS, |_| 0.0);
        assert!(!t.gathering(), "the trial's first epoch runs the other way");
        run(&mut t, &mut now, GATHER_EPOCH_NS, |_| 0.0);
        assert!(t.gathering(), "its second runs the chosen way");
    }
}
