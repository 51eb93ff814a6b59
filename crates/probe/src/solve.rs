//! From a sweep's points to its solutions: where bandwidth stops rising
//! with vrate, the cheapest vrate or cap that keeps the QD 1 probe within
//! its target, when a sweep may stop early, and which candidate to confirm.

use crate::driver::JobStats;
use crate::tune_point::{Knob, Solution, TunePoint};

/// The isolation solution's point, if it isolates and was measured once.
pub(crate) fn to_confirm(
    points: &[TunePoint],
    depths: &[TunePoint],
    solo: JobStats,
    factor: f64,
) -> Option<Knob> {
    let iso = solutions(points, depths, solo, factor)
        .into_iter()
        .find(|s| s.name == "isolation")?;
    let p = solution_point(points, depths, &iso)?;
    (p.runs == 1 && p.isolation <= factor).then(|| Knob::of(p))
}

/// The point a solution was named at: its cap point, or its vrate point.
pub(crate) fn solution_point<'a>(
    points: &'a [TunePoint],
    depths: &'a [TunePoint],
    s: &Solution,
) -> Option<&'a TunePoint> {
    match s.light_depth {
        Some(n) => depths.iter().find(|p| p.light_depth == Some(n)),
        None => points.iter().find(|p| p.vrate == s.vrate),
    }
}

/// Runs of one setting as one point: the probe of the run with the highest
/// p99 and the adversary of the slowest, so a confirmed point claims no
/// more than its worst run showed.
pub(crate) fn worst_of(first: TunePoint, more: &[TunePoint], solo: JobStats) -> TunePoint {
    let worst = more.iter().fold(first, |a, &b| {
        if b.probe.p99_us > a.probe.p99_us {
            b
        } else {
            a
        }
    });
    let slowest = more.iter().fold(first, |a, &b| {
        if b.adversary.rate < a.adversary.rate {
            b
        } else {
            a
        }
    });
    TunePoint {
        adversary: slowest.adversary,
        vrate_held: slowest.vrate_held,
        cpu_us_per_io: slowest.cpu_us_per_io,
        isolation: worst.probe.p99_us / solo.p99_us.max(1e-3),
        runs: first.runs + more.iter().map(|p| p.runs).sum::<u32>(),
        ..worst
    }
}

/// The plateau: the median rate of the points at and above the vrate of
/// the fastest one (a median, so one noisy point does not set it).
fn plateau(points: &[(f64, f64)]) -> Option<f64> {
    let top = points.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let above: Vec<f64> = points
        .iter()
        .filter(|p| p.0 >= top.0)
        .map(|p| p.1)
        .collect();
    Some(crate::converge::median(&above))
}

/// The adversary used (nearly) all its budget: a point on the rising line.
pub(crate) fn on_line(p: &TunePoint) -> bool {
    p.budgeted_rate() >= 0.9 * p.budget_iops
}

/// Lower vrates only give less bandwidth: stop once a point off the line
/// (the plateau) has been seen and the last two are on the line and
/// isolate. A disk whose rate drifts may dip below its plateau for a point
/// or two; only its budget holds a point on the line. (On a machine so busy
/// that no point reaches its budget, the sweep runs to the end.)
pub(crate) fn done_early(points: &[TunePoint], factor: f64) -> bool {
    let n = points.len();
    n >= 3
        && points.iter().any(|p| !on_line(p))
        && points[n - 2..]
            .iter()
            .all(|p| on_line(p) && p.isolation <= factor)
}

/// Lower caps only give less bandwidth: stop once the last two isolate.
pub(crate) fn depths_done(depths: &[TunePoint], factor: f64) -> bool {
    let n = depths.len();
    n >= 2 && depths[n - 2..].iter().all(|p| p.isolation <= factor)
}

/// The cap point that keeps the probe within `factor` of solo with the
/// most adversary bandwidth, if any does, of those below which every cap
/// measured isolates too: the probe's p99 falls with the cap, so a cap
/// that isolates above one that does not had a lucky run (on the disk a
/// cap of 12 measured within target between 16 and 10 over it, and in the
/// bench was over in 6 reps of 6, docs/evidence.md#tune-light-depth).
pub fn isolating_depth(depths: &[TunePoint], factor: f64) -> Option<&TunePoint> {
    let isolates = |p: &TunePoint| p.isolation <= factor;
    depths
        .iter()
        .filter(|p| {
            isolates(p)
                && depths
                    .iter()
                    .filter(|q| q.light_depth < p.light_depth)
                    .all(isolates)
        })
        .max_by(|a, b| a.adversary.rate.total_cmp(&b.adversary.rate))
}

/// The vrate where bandwidth stops rising: where the rising line through
/// the origin meets the plateau. Points are (vrate, IOPS, budget IOPS).
/// The line's points are those that used their budget; if none did (a
/// busy machine slows the probe, the line and the plateau alike), those
/// well below the plateau. The line's slope and the plateau are medians,
/// so one point of a noisy disk moves neither.
pub fn bandwidth_knee(points: &[(f64, f64, f64)]) -> Option<f64> {
    let curve: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.1)).collect();
    let top = plateau(&curve)?;
    let by_budget = |p: &&(f64, f64, f64)| p.1 >= 0.9 * p.2;
    let below_top = |p: &&(f64, f64, f64)| p.1 < 0.9 * top;
    let on_line: &dyn Fn(&&(f64, f64, f64)) -> bool = if points.iter().any(|p| by_budget(&p)) {
        &by_budget
    } else {
        &below_top
    };
    let (line, flat): (Vec<&(f64, f64, f64)>, Vec<_>) =
        points.iter().filter(|p| p.0 > 0.0).partition(on_line);
    if line.is_empty() {
        // Flat everywhere measured: the lowest vrate already saturates.
        return points.iter().map(|p| p.0).reduce(f64::min);
    }
    let slope = crate::converge::median(&line.iter().map(|p| p.1 / p.0).collect::<Vec<_>>());
    let level = if flat.is_empty() {
        top
    } else {
        crate::converge::median(&flat.iter().map(|p| p.1).collect::<Vec<_>>())
    };
    Some(level / slope)
}

/// The isolation solution's vrate: the point that keeps the probe within
/// `factor` of solo with the most adversary bandwidth (not the highest such
/// vrate, nor one capped at the bandwidth knee: a budget below a point that
/// was measured to isolate with more bandwidth binds the device for
/// nothing). With no point isolating, the lowest vrate.
pub fn isolation_point(points: &[TunePoint], factor: f64) -> Option<f64> {
    let isolates = |p: &&TunePoint| p.isolation <= factor;
    let best = points.iter().filter(isolates).max_by(|a, b| {
        a.adversary
            .rate
            .total_cmp(&b.adversary.rate)
            .then(a.vrate.total_cmp(&b.vrate))
    });
    match best {
        Some(p) => Some(p.vrate),
        None => points.iter().map(|p| p.vrate).reduce(f64::min),
    }
}

/// The bandwidth, isolation and balanced solutions. Isolation is the
/// cheapest setting that isolates: of the vrate and cap points keeping the
/// probe within `factor` of solo, the one where the adversary moved the
/// most. Bandwidth and balanced are vrates (the curve is the budget's).
pub fn solutions(
    points: &[TunePoint],
    depths: &[TunePoint],
    solo: JobStats,
    factor: f64,
) -> Vec<Solution> {
    let curve: Vec<(f64, f64, f64)> = points
        .iter()
        .map(|p| (p.vrate, p.budgeted_rate(), p.budget_iops))
        .collect();
    let (Some(bw), Some(iso)) = (bandwidth_knee(&curve), isolation_point(points, factor)) else {
        return Vec::new();
    };
    let p99_at = |v: f64| {
        let nearest = points
            .iter()
            .min_by(|a, b| (a.vrate - v).abs().total_cmp(&(b.vrate - v).abs()));
        nearest.map_or(solo.p99_us, |p| p.probe.p99_us)
    };
    let held = |name: &str, vrate: f64| Solution {
        name: name.into(),
        vrate,
        light_depth: None,
        probe_target_us: None,
        probe_p99_us: Some(p99_at(vrate)),
        kernel_vrate: None,
    };
    // The vrate point's rate, if it isolates (else it is only the lowest).
    let iso_rate = points
        .iter()
        .find(|p| p.vrate == iso && p.isolation <= factor)
        .map(|p| p.adversary.rate);
    let isolation = match isolating_depth(depths, factor) {
        Some(d) if iso_rate.is_none_or(|r| d.adversary.rate > r) => Solution {
            vrate: 0.0,
            light_depth: d.light_depth,
            probe_p99_us: Some(d.probe.p99_us),
            kernel_vrate: Some(iso),
            ..held("isolation", iso)
        },
        _ => held("isolation", iso),
    };
    vec![
        held("bandwidth", bw),
        Solution {
            probe_target_us: Some(factor * solo.p99_us),
            ..isolation
        },
        held("balanced", (bw + iso) / 2.0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune_point::test_point as point;
    use crate::tune_point::VRATES;

    #[test]
    fn bandwidth_knee_meets_line_and_plateau() {
        // The budget allows 10 IOPS a percent, the device 1250: knee 125%.
        let pts: Vec<(f64, f64, f64)> = VRATES
            .iter()
            .map(|v| (*v, (v * 10.0).min(1250.0), v * 10.0))
            .collect();
        let knee = bandwidth_knee(&pts).expect("a knee");
        assert!((knee - 125.0).abs() < 1e-6, "{knee}");
        // A busy machine slows line and plateau alike (no point reaches its budget).
        let slow: Vec<_> = pts.iter().map(|p| (p.0, 0.7 * p.1, p.2)).collect();
        let knee = bandwidth_knee(&slow).expect("a knee");
        assert!((knee - 125.0).abs() < 1e-6, "{knee}");
        // A noisy disk: slow and fast plateau points, one a line point missed.
        let noisy = [
            (200.0, 1250.0, 2000.0),
            (160.0, 1400.0, 1600.0),
            (130.0, 1300.0, 1300.0),
            (115.0, 800.0, 1150.0),
            (100.0, 1000.0, 1000.0),
            (80.0, 800.0, 800.0),
        ];
        assert_eq!(bandwidth_knee(&noisy), Some(125.0));
        assert_eq!(
            bandwidth_knee(&[(50.0, 10.0, 500.0), (100.0, 10.0, 1000.0)]),
            Some(50.0)
        );
        assert_eq!(bandwidth_knee(&[]), None);
    }

    #[test]
    fn a_confirmed_candidate_keeps_its_worst_run_and_hands_over_if_it_fails() {
        let solo = point(1.0, 1.0, 1.0).probe;
        let mut pts = vec![
            point(100.0, 29000.0, 2.5),
            point(60.0, 20000.0, 1.8),
            point(30.0, 8000.0, 1.2),
        ];
        assert_eq!(to_confirm(&pts, &[], solo, 2.0), Some(Knob::Vrate(60.0)));
        // Runs again: one slower adversary, one probe over its target.
        let again = [point(60.0, 19000.0, 1.7), point(60.0, 21000.0, 2.4)];
        let w = worst_of(pts[1], &again, solo);
        assert_eq!((w.runs, w.adversary.rate), (3, 19000.0));
        assert!((w.isolation - 2.4).abs() < 1e-9 && w.probe.p99_us == 240.0);
        pts[1] = w;
        // 60% no longer isolates: 30% is next, then confirmed, nothing is.
        assert_eq!(to_confirm(&pts, &[], solo, 2.0), Some(Knob::Vrate(30.0)));
        pts[2] = worst_of(pts[2], &[point(30.0, 8100.0, 1.3)], solo);
        assert_eq!(to_confirm(&pts, &[], solo, 2.0), None);
        let s = solutions(&pts, &[], solo, 2.0);
        assert_eq!(s[1].vrate, 30.0);
        // Nothing isolates: the lowest vrate is named, nothing confirmed.
        let over = [point(100.0, 29000.0, 3.0), point(50.0, 15000.0, 2.5)];
        assert_eq!(to_confirm(&over, &[], solo, 2.0), None);
        assert_eq!(Knob::of(&over[1]).key(), "vrate-050.0");
    }
}
