//! Where a cost point peaks: a short search over queue depth. iocost's
//! parameters are a device's highest rates, and a device may deliver its
//! highest rate only in a band of QDs: below it the IOs' latency bounds the
//! rate, above it (a drive whose latency grows past a knee) the queue does.
//! A fixed QD missed that band: a `model` bdev of knee QD 24 read 4 KiB
//! sequentially at QD 64 gave `rseqiops` -36%.
//!
//! The search is sans-IO: [`QdSearch::next`] names the QD to measure and
//! [`QdSearch::record`] takes its rate. It climbs QD 1, 2, 4, ... and stops
//! two steps after the rate last rose by [`GAIN`] (a plateau, or past the
//! peak), or at once when the rate falls by [`FALL`] under the best (past
//! a knee: a deeper queue only waits longer); then it tries the geometric midpoints on either side of the best
//! QD (3/4 and 3/2 of it). The peak is the middle of the QDs whose rate is
//! within [`GAIN`] of the best ([`QdSearch::peak`]): not the edge of that
//! band, where a little more latency in the rounds that follow (a busy
//! machine's) falls off it. (At its lowest QD, a `model` bdev's 4 KiB random
//! writes of 83k IOPS measured 18% under that in the rounds.)

/// A rise smaller than this is the plateau's noise, not a climb.
pub const GAIN: f64 = 0.03;
/// Doublings without a rise of [`GAIN`] before the climb stops.
pub const STALE_STEPS: u32 = 2;
/// A fall under the best this deep ends the climb at once: the peak is
/// passed. (Far beyond a plateau's noise: a disk's rate over a search
/// point's three windows wanders by a few percent.)
pub const FALL: f64 = 0.25;

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Climb { next: u32 },
    Refine { todo: Vec<u32> },
    Done,
}

/// One cost point's search.
#[derive(Debug, Clone, PartialEq)]
pub struct QdSearch {
    max_qd: u32,
    /// Every QD measured, in order, with its rate.
    seen: Vec<(u32, f64)>,
    /// Steps since the rate last rose by [`GAIN`] over the best.
    stale: u32,
    phase: Phase,
}

impl QdSearch {
    /// A search of QDs 1 to `max_qd` (at least 1).
    pub fn new(max_qd: u32) -> QdSearch {
        QdSearch {
            max_qd: max_qd.max(1),
            seen: Vec::new(),
            stale: 0,
            phase: Phase::Climb { next: 1 },
        }
    }

    /// The QD to measure next; none when the search is over.
    pub fn next(&self) -> Option<u32> {
        match &self.phase {
            Phase::Climb { next } => Some(*next),
            Phase::Refine { todo } => todo.first().copied(),
            Phase::Done => None,
        }
    }

    /// The rate measured at `qd`, which must be the QD [`next`](Self::next) named.
    pub fn record(&mut self, qd: u32, iops: f64) {
        assert_eq!(
            self.next(),
            Some(qd),
            "a rate for a QD the search did not ask for"
        );
        let best = self.best().map_or(0.0, |b| b.1);
        self.seen.push((qd, iops));
        self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Climb { next } => {
                self.stale = if iops >= best * (1.0 + GAIN) {
                    0
                } else {
                    self.stale + 1
                };
                let up = next.saturating_mul(2);
                let passed = iops < best * (1.0 - FALL);
                if self.stale >= STALE_STEPS || passed || up > self.max_qd {
                    self.refine()
                } else {
                    Phase::Climb { next: up }
                }
            }
            Phase::Refine { mut todo } => {
                todo.remove(0);
                if todo.is_empty() {
                    Phase::Done
                } else {
                    Phase::Refine { todo }
                }
            }
            Phase::Done => Phase::Done,
        };
    }

    /// The midpoints around the best QD of the climb not yet measured.
    fn refine(&self) -> Phase {
        let Some((b, _)) = self.best() else {
            return Phase::Done;
        };
        let todo: Vec<u32> = [b * 3 / 4, b + b / 2]
            .into_iter()
            .filter(|q| *q >= 1 && *q <= self.max_qd && !self.seen.iter().any(|s| s.0 == *q))
            .collect();
        if todo.is_empty() {
            Phase::Done
        } else {
            Phase::Refine { todo }
        }
    }

    /// The QD of the highest rate measured so far (the lower QD of a tie).
    pub fn best(&self) -> Option<(u32, f64)> {
        self.seen.iter().copied().reduce(|a, b| {
            if b.1 > a.1 || (b.1 == a.1 && b.0 < a.0) {
                b
            } else {
                a
            }
        })
    }

    /// The QD to measure the point at: of the QDs within [`GAIN`] of the
    /// best rate, the middle one (the lower of two).
    pub fn peak(&self) -> Option<u32> {
        let (_, top) = self.best()?;
        let mut band: Vec<u32> = self
            .seen
            .iter()
            .filter(|p| p.1 >= top * (1.0 - GAIN))
            .map(|p| p.0)
            .collect();
        band.sort_unstable();
        band.get((band.len() - 1) / 2).copied()
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Every QD measured with its rate, in order.
    pub fn seen(&self) -> &[(u32, f64)] {
        &self.seen
    }
}

/// A finished search, for the report: what was tried and the QD taken.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    pub label: String,
    pub tried: Vec<(u32, f64)>,
    pub qd: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a rate curve; returns the QD found and the QDs tried.
    fn run(max_qd: u32, rate: impl Fn(u32) -> f64) -> (u32, Vec<u32>) {
        let mut s = QdSearch::new(max_qd);
        let mut steps = 0;
        while let Some(qd) = s.next() {
            s.record(qd, rate(qd));
            steps += 1;
            assert!(steps < 32, "the search ends");
        }
        assert!(s.is_done());
        let tried = s.seen().iter().map(|p| p.0).collect();
        (s.peak().expect("a peak"), tried)
    }

    /// The `model` bdev's closed loop: QD IOs of `s` device time, `lat`
    /// fixed latency and `knee_us` more per IO past `knee`, at most 1/s.
    fn model(s: f64, lat: f64, knee: u32, knee_us: f64) -> impl Fn(u32) -> f64 {
        move |qd| {
            let extra = f64::from(qd.saturating_sub(knee)) * knee_us;
            (f64::from(qd) / (s + lat + extra)).min(1.0 / s)
        }
    }

    #[test]
    fn a_knee_is_found_before_the_latency_it_adds() {
        // The device: 4 KiB sequential reads of ~14.5 us, 70 us
        // latency, 30 us more per IO past QD 24: full rate at QD 6-41 only.
        let rate = model(14.5, 70.0, 24, 30.0);
        let (qd, tried) = run(256, &rate);
        assert!((rate(qd) * 14.5 - 1.0).abs() < 1e-9, "QD {qd}: {tried:?}");
        // The middle of the full-rate band 6-32 measured, not its edge.
        assert_eq!(qd, 12, "{tried:?}");
        assert!(tried.len() <= 8, "{tried:?}");
        assert!(rate(64) * 14.5 < 0.75, "QD 64 is past the knee");
    }

    #[test]
    fn a_fall_past_the_peak_ends_the_climb() {
        // The slow shape's 4 KiB sequential reads: 4 ms latency, 2 ms more
        // an IO past QD 16; at QD 32 the rate is under half the peak.
        let rate = model(527.0, 4000.0, 16, 2000.0);
        let (qd, tried) = run(64, &rate);
        assert_eq!(tried, [1, 2, 4, 8, 16, 32, 12, 24], "no QD 64");
        assert!((rate(qd) * 527.0 - 1.0).abs() < 0.05, "QD {qd}: {tried:?}");
        // A dip of 10% on the plateau does not.
        let dip = |qd: u32| {
            let plateau = 1000.0 * f64::from(qd.min(4));
            if qd == 8 {
                plateau * 0.9
            } else {
                plateau
            }
        };
        let (_, tried) = run(64, dip);
        assert_eq!(tried[..5], [1, 2, 4, 8, 16], "{tried:?}");
    }

    #[test]
    fn a_peak_between_doublings_is_refined() {
        // Peaks sharply at QD 6: rising to it, falling past it.
        let rate = |qd: u32| 1000.0 - (f64::from(qd) - 6.0).abs() * 100.0;
        let (qd, tried) = run(64, rate);
        assert_eq!(qd, 6, "{tried:?}");
        assert_eq!(tried, [1, 2, 4, 8, 16, 3, 6]);
    }

    #[test]
    fn a_plateau_stops_the_climb() {
        // Saturated from QD 4 on; noise of ±1% does not look like a rise.
        let rate = |qd: u32| {
            if qd >= 4 {
                1000.0 + f64::from(qd % 3) * 10.0
            } else {
                250.0 * f64::from(qd)
            }
        };
        let (qd, tried) = run(256, rate);
        assert!(rate(qd) >= 1000.0, "QD {qd}: {tried:?}");
        assert!(tried.iter().all(|q| *q <= 16), "{tried:?}");
        // A device that keeps rising climbs to the top.
        let (qd, tried) = run(64, f64::from);
        assert_eq!((qd, tried.last().copied()), (64, Some(48)));
        // One QD only.
        assert_eq!(run(1, |_| 5.0), (1, vec![1]));
        // Serial: every QD is the peak; the middle of those tried.
        assert_eq!(run(64, |_| 100.0), (2, vec![1, 2, 4]));
    }

    #[test]
    #[should_panic(expected = "did not ask for")]
    fn a_rate_for_another_qd_is_a_bug() {
        QdSearch::new(8).record(4, 1.0);
    }
}
