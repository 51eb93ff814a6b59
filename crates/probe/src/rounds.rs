//! The alternated points' rounds: every point of a plan once a round, in
//! turn, so a drift of the device or the machine spreads over all points
//! instead of skewing one; each point is the median of its rounds.
//!
//! How many rounds: at least [`RoundCount::min`], then until every cost
//! point's round rates agree ([`agree`]: the 95% interval of their mean
//! within ±[`RoundCount::ci`], less the one round furthest from their
//! median), at most [`RoundCount::max`]. A device whose rates hold still (a
//! `model` bdev) stops at the least; one that drifts (a shared disk) takes
//! every round, as all probes did before. One round off by itself (the
//! machine held the probe; the point's median leaves it out anyway) does
//! not hold the rounds: on the slow model shape one 128 KiB write round of
//! 500 IOPS among nine of 568 kept the mean's interval over ±3% to the
//! tenth round, 125 s of probe instead of 66. Only the cost
//! points are waited for: they are the six parameters, while the QD 1
//! points (each IO's latency alone, on a timer a busy machine disturbs by a
//! few percent) and the held-out mixes are checks that ride along.

use crate::converge::{mean_and_rel_ci, median, StopRule};
use crate::driver::Measurement;
use crate::plan::{self, Fixed, Rounds, Row};
use crate::ProbeError;

/// How many rounds the points take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundCount {
    pub min: u32,
    pub max: u32,
    /// Relative half-width of the 95% interval of a cost point's round
    /// rates that lets the rounds stop before `max`.
    pub ci: f64,
}

impl RoundCount {
    /// Exactly `n` rounds.
    pub fn fixed(n: u32, ci: f64) -> RoundCount {
        RoundCount { min: n, max: n, ci }
    }
}

/// Whether the rounds `seen` so far (per point of `plan`, in order) are
/// enough: `count.max` of them, or at least `count.min` with every cost
/// point's rates within ±`count.ci`.
pub fn rounds_done(plan: &[Fixed], seen: &[Vec<f64>], count: &RoundCount) -> bool {
    assert_eq!(
        plan.len(),
        seen.len(),
        "a round's rates per point of the plan"
    );
    let n = seen.iter().map(Vec::len).min().unwrap_or(0);
    assert!(
        seen.iter().all(|s| s.len() == n),
        "every point runs once a round"
    );
    if n >= count.max as usize {
        return true;
    }
    n >= count.min as usize
        && plan
            .iter()
            .zip(seen)
            .filter(|(f, _)| plan::is_cost_point(f))
            .all(|(_, rates)| agree(rates, count.ci))
}

/// Whether a point's round rates agree: the 95% interval of their mean
/// within ±`ci`, less the round furthest from their median when four or
/// more ran.
pub fn agree(rates: &[f64], ci: f64) -> bool {
    let mut rest = rates.to_vec();
    if rest.len() >= 4 {
        let mid = median(rates);
        let far = (0..rest.len())
            .max_by(|a, b| (rest[*a] - mid).abs().total_cmp(&(rest[*b] - mid).abs()))
            .expect("four rounds or more");
        rest.remove(far);
    }
    mean_and_rel_ci(&rest).1 <= ci
}

/// Measures every point of `plan` once a round, in turn, until
/// [`rounds_done`]; `measure` runs a point (the device, or a model in
/// virtual time in tests). Returns each point's rounds.
pub(crate) fn rounds_of(
    plan: &[Fixed],
    count: &RoundCount,
    mut measure: impl FnMut(&Fixed) -> Result<Measurement, ProbeError>,
) -> Result<Vec<Vec<Measurement>>, ProbeError> {
    assert!(count.min >= 1 && count.min <= count.max, "{count:?}");
    let mut seen: Vec<Vec<Measurement>> = plan.iter().map(|_| Vec::new()).collect();
    let mut rates: Vec<Vec<f64>> = plan.iter().map(|_| Vec::new()).collect();
    while !rounds_done(plan, &rates, count) {
        for ((f, seen), rates) in plan.iter().zip(&mut seen).zip(&mut rates) {
            let m = measure(f)?;
            rates.push(m.iops);
            seen.push(m);
        }
    }
    Ok(seen)
}

/// The plan's rows (each point its median round) and every round's IOPS.
pub fn rows_of(
    plan: &[Fixed],
    seen: Vec<Vec<Measurement>>,
    rule: &StopRule,
) -> (Vec<Row>, Vec<Rounds>) {
    let rounds = plan
        .iter()
        .zip(&seen)
        .map(|(f, ms)| (f.label.clone(), ms.iter().map(|m| m.iops).collect()))
        .collect();
    let rows = plan
        .iter()
        .zip(seen)
        .map(|(f, ms)| (f.label.clone(), f.w, f.qd, median_round(ms, rule)))
        .collect();
    (rows, rounds)
}

/// A point from its rounds: the median round's IOPS (robust to a round
/// the disk stalled in) and latencies, the 95% interval of the round rates,
/// and the time of all rounds. One round is the point itself.
pub fn median_round(mut rounds: Vec<Measurement>, rule: &StopRule) -> Measurement {
    assert!(!rounds.is_empty(), "a point of no rounds");
    if rounds.len() == 1 {
        return rounds[0];
    }
    let rates: Vec<f64> = rounds.iter().map(|m| m.iops).collect();
    let (_, rel_ci) = mean_and_rel_ci(&rates);
    let secs = rounds.iter().map(|m| m.secs).sum();
    rounds.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    let mid = rounds.len() / 2;
    let mut m = rounds[mid];
    if rounds.len().is_multiple_of(2) {
        // The median of an even count: the middle two's mean.
        let low = rounds[mid - 1];
        m.iops = (m.iops + low.iops) / 2.0;
        m.bytes_per_s = (m.bytes_per_s + low.bytes_per_s) / 2.0;
    }
    Measurement {
        rel_ci,
        converged: rel_ci <= rule.ci,
        secs,
        ..m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::test_round as round;

    #[test]
    fn a_point_is_its_median_round_with_the_rounds_interval() {
        let rule = StopRule::device();
        // A round the disk stalled in (10) moves the median, not the mean, little.
        let m = median_round(
            vec![round(100.0, 1.0), round(10.0, 9.0), round(104.0, 2.0)],
            &rule,
        );
        assert_eq!((m.iops, m.p99_us, m.secs), (100.0, 1.0, 1.5));
        let (_, ci) = mean_and_rel_ci(&[100.0, 10.0, 104.0]);
        assert_eq!(m.rel_ci, ci);
        assert!(!m.converged);
        let even = [98.0, 102.0, 101.0, 99.0].map(|x| round(x, 1.0)).to_vec();
        let m = median_round(even, &rule);
        assert_eq!(m.iops, 100.0);
        assert!(m.converged, "±{:.1}%", 100.0 * m.rel_ci);
        let one = round(7.0, 3.0);
        assert_eq!(median_round(vec![one], &rule), one);
    }

    /// Runs `rounds_of` over the full plan, each point's rate in round
    /// `r` given by `rate(point index, r)`; returns the rounds taken.
    fn taken(count: &RoundCount, rate: impl Fn(usize, usize) -> f64) -> usize {
        let plan = plan::fixed_plan(true, &[]);
        let mut calls = 0;
        let seen = rounds_of(&plan, count, |f| {
            let i = plan
                .iter()
                .position(|p| p == f)
                .expect("a point of the plan");
            let r = rate(i, calls / plan.len());
            calls += 1;
            Ok(round(r, 0.0))
        })
        .expect("rounds");
        assert!(seen.iter().all(|s| s.len() == seen[0].len()));
        assert_eq!(calls, seen[0].len() * plan.len(), "whole rounds only");
        seen[0].len()
    }

    #[test]
    fn steady_cost_points_stop_the_rounds_at_the_least() {
        let count = RoundCount {
            min: 4,
            max: 10,
            ci: 0.03,
        };
        let plan = plan::fixed_plan(true, &[]);
        let cost = |i: usize| plan::is_cost_point(&plan[i]);
        // Steady cost points; the other points noisy by ±20%: they ride along.
        let noisy = |i: usize, r: usize| {
            if cost(i) {
                1000.0 + (r % 2) as f64
            } else {
                1000.0 * (1.0 + 0.2 * if r.is_multiple_of(2) { 1.0 } else { -1.0 })
            }
        };
        assert_eq!(taken(&count, noisy), 4);
        // A cost point that drifts by 10% a round: every round.
        let drift = |i: usize, r: usize| {
            if i == 1 {
                1000.0 * (1.0 + 0.1 * r as f64)
            } else {
                1000.0
            }
        };
        assert_eq!(taken(&count, drift), 10);
        // A round off by itself (a tenth of the rate) does not hold the
        // rounds; two do, until the interval narrows again, or to the end.
        let stall = |i: usize, r: usize| if i == 0 && r == 1 { 100.0 } else { 1000.0 };
        assert_eq!(taken(&count, stall), 4);
        let stalls = |i: usize, r: usize| {
            if i == 0 && (r == 1 || r == 2) {
                100.0
            } else {
                1000.0
            }
        };
        assert!(taken(&count, stalls) > 4);
        assert_eq!(taken(&RoundCount::fixed(3, 0.03), drift), 3);
    }

    #[test]
    fn rounds_agree_but_for_one_off_by_itself() {
        // The slow shape's 128 KiB writes: one round 12% low.
        let rounds = [568.0, 568.0, 568.0, 500.0];
        assert!(agree(&rounds, 0.03));
        assert!(mean_and_rel_ci(&rounds).1 > 0.03);
        assert!(!agree(&[568.0, 568.0, 500.0, 500.0], 0.03));
        // Three rounds: none left out.
        assert!(!agree(&[568.0, 568.0, 500.0], 0.03));
        assert!(agree(&[568.0, 569.0, 568.0], 0.03));
        // A drift is no single round off.
        assert!(!agree(&[1000.0, 1050.0, 1100.0, 1150.0, 1200.0], 0.03));
    }

    #[test]
    fn rounds_done_counts_whole_rounds() {
        let plan = plan::cost_plan(100).to_vec();
        let count = RoundCount::fixed(2, 0.03);
        assert!(!rounds_done(&plan, &[vec![], vec![], vec![]], &count));
        let one = vec![vec![1.0]; 3];
        assert!(!rounds_done(&plan, &one, &count));
        assert!(rounds_done(&plan, &vec![vec![1.0, 1.0]; 3], &count));
    }
}
