//! From measured rates to the device's numbers: the six parameters of the
//! linear cost model, the knee of a QD curve, and what the model predicts.

use pace::pacer::{CostModel, IoKind};

/// The block size of the small IOs the IOPS parameters are measured with.
pub const SMALL: u32 = 4096;
/// The block size of the large sequential IOs the byte cost is measured
/// with: the largest IO iopace sends a device, its default buffer size (a
/// request is read or written in buffer-sized pieces). Until 2026-11-26 it
/// was 1 MiB, an IO the server never sends, and on this machine's disk
/// 1 MiB reads moved ~1.0 GB/s where 128 KiB reads moved ~1.9: the byte
/// cost between them under-predicted mixes of 4-64 KiB IOs by 5-25%.
pub const LARGE: u32 = 128 << 10;

/// Saturated rates (IOs per second) of one direction's cost points.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostPoints {
    pub seq_small_iops: f64,
    pub seq_large_iops: f64,
    pub rand_small_iops: f64,
}

/// The byte cost (s/B) of the sequential points `(bytes, seconds per IO)`:
/// the least-squares line `a + b x bytes` weighted by each point's relative
/// error (weights 1/t^2), so no one point decides it.
pub fn byte_cost(points: &[(u32, f64)]) -> f64 {
    let (mut s, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(bytes, t) in points {
        debug_assert!(t > 0.0, "a point without time");
        let (w, x) = (1.0 / (t * t), f64::from(bytes));
        s += w;
        sx += w * x;
        sy += w * t;
        sxx += w * x * x;
        sxy += w * x * t;
    }
    let det = s * sxx - sx * sx;
    if det > 0.0 {
        (s * sxy - sx * sy) / det
    } else {
        0.0
    }
}

/// One direction's parameters `(bps, seqiops, randiops)`, solving the
/// model's per-IO time `1/iops + bytes/bps` for the points: the sequential
/// sizes give the byte cost ([`byte_cost`]) and the sequential IO cost, the
/// random one its IO cost. A byte cost lost in noise falls back to the large
/// IOs' bandwidth; an IO cost lost in noise to the small IOs' rate.
pub fn solve_direction(p: &CostPoints) -> (f64, f64, f64) {
    let t_seq_small = 1.0 / p.seq_small_iops;
    let t_seq_large = 1.0 / p.seq_large_iops;
    let t_rand_small = 1.0 / p.rand_small_iops;
    let per_byte = byte_cost(&[(SMALL, t_seq_small), (LARGE, t_seq_large)]);
    let per_byte = if per_byte > 0.0 {
        per_byte
    } else {
        t_seq_large / f64::from(LARGE)
    };
    let io_cost = |t: f64| {
        let c = t - f64::from(SMALL) * per_byte;
        if c > 0.0 {
            1.0 / c
        } else {
            1.0 / t
        }
    };
    (1.0 / per_byte, io_cost(t_seq_small), io_cost(t_rand_small))
}

/// The cost model from both directions' points; writes not measured keep
/// the read side's numbers, so a read-only probe still yields a usable model.
pub fn cost_model(read: &CostPoints, write: Option<&CostPoints>) -> CostModel {
    let (rbps, rseqiops, rrandiops) = solve_direction(read);
    let (wbps, wseqiops, wrandiops) = write.map_or((rbps, rseqiops, rrandiops), solve_direction);
    CostModel {
        rbps,
        rseqiops,
        rrandiops,
        wbps,
        wseqiops,
        wrandiops,
    }
}

/// IOPS the model predicts for a mix of random IOs, `read_pct` percent
/// reads, each of the `sizes` equally often, on a saturated device: one
/// over the mean device time of an IO.
pub fn predicted_iops(m: &CostModel, read_pct: u32, sizes: &[u32]) -> f64 {
    debug_assert!(!sizes.is_empty(), "a mix of no IO sizes");
    let r = f64::from(read_pct) / 100.0;
    let ns: f64 = sizes
        .iter()
        .map(|&bs| {
            r * m.cost(IoKind::Read, bs, false) + (1.0 - r) * m.cost(IoKind::Write, bs, false)
        })
        .sum::<f64>()
        / sizes.len() as f64;
    1e9 / ns
}

/// Seconds of device time the model gives the mean IO of a random mix,
/// `read_pct` percent reads, each of the `sizes` equally often.
pub fn mix_cost_s(m: &CostModel, read_pct: u32, sizes: &[u32]) -> f64 {
    1.0 / predicted_iops(m, read_pct, sizes)
}

/// An IO's latency alone on the device (QD 1), linear in its size:
/// `base_s + bytes * per_byte_s`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Unloaded {
    pub base_s: f64,
    pub per_byte_s: f64,
}

impl Unloaded {
    /// The line through a small and a large IO's latency alone (seconds);
    /// a large IO measured no slower than a small one gives a flat line.
    pub fn through(small_s: f64, large_s: f64) -> Unloaded {
        let per_byte_s = ((large_s - small_s) / f64::from(LARGE - SMALL)).max(0.0);
        Unloaded {
            base_s: (small_s - f64::from(SMALL) * per_byte_s).max(0.0),
            per_byte_s,
        }
    }

    pub fn of(&self, bytes: u32) -> f64 {
        self.base_s + f64::from(bytes) * self.per_byte_s
    }
}

/// The mean latency alone of a mix's IOs, `read_pct` percent reads, each
/// of the `sizes` equally often.
pub fn mix_unloaded_s(read: &Unloaded, write: &Unloaded, read_pct: u32, sizes: &[u32]) -> f64 {
    let r = f64::from(read_pct) / 100.0;
    sizes
        .iter()
        .map(|&bs| r * read.of(bs) + (1.0 - r) * write.of(bs))
        .sum::<f64>()
        / sizes.len().max(1) as f64
}

/// A closed loop of `qd` IOs on a device where an IO alone takes
/// `alone_s` (its latency at QD 1) and the busy device serves one IO every
/// `cost_s`: an IO waits for the `qd - 1` ahead of it, so its latency is
/// `alone_s + (qd - 1) * cost_s`, and by Little's law the rate is `qd` over
/// that. It rises as `qd / alone_s` (latency-bound) and bends over to
/// `1 / cost_s` (capacity-bound).
pub fn iops_at_qd(cost_s: f64, alone_s: f64, qd: u32) -> f64 {
    let qd = f64::from(qd.max(1));
    qd / (alone_s.max(cost_s) + (qd - 1.0) * cost_s)
}

/// The device time per IO at saturation of a point that did `rate` IOs a
/// second at `qd`, an IO alone taking `alone_s`: `iops_at_qd` solved for
/// `cost_s`, so a point measured below its knee is not taken for the
/// device's capacity. At most half of the point's time is taken away (a
/// point that far below its knee says little about the capacity); QD 1
/// says nothing about it.
pub fn saturated_cost_s(rate: f64, qd: u32, alone_s: f64) -> f64 {
    let t = 1.0 / rate;
    if qd <= 1 {
        return t;
    }
    let q = f64::from(qd);
    ((q * t - alone_s.max(0.0)) / (q - 1.0)).clamp(t / 2.0, t)
}

/// Which bound a workload at a QD is under: the share of the capacity
/// `iops_at_qd` reaches there.
pub fn share_of_capacity(cost_s: f64, unloaded_s: f64, qd: u32) -> f64 {
    iops_at_qd(cost_s, unloaded_s, qd) * cost_s
}

/// The knee: the smallest QD whose IOPS reach 95% of the curve's maximum.
pub fn knee(curve: &[(u32, f64)]) -> Option<u32> {
    let max = curve.iter().map(|p| p.1).fold(0.0, f64::max);
    curve
        .iter()
        .filter(|p| p.1 >= 0.95 * max)
        .map(|p| p.0)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(m: &CostModel, kind: IoKind) -> CostPoints {
        let rate = |bytes, seq| 1e9 / m.cost(kind, bytes, seq);
        CostPoints {
            seq_small_iops: rate(SMALL, true),
            seq_large_iops: rate(LARGE, true),
            rand_small_iops: rate(SMALL, false),
        }
    }

    #[test]
    fn exact_rates_give_back_the_model() {
        let truth = CostModel {
            rbps: 1.2e9,
            rseqiops: 90_000.0,
            rrandiops: 40_000.0,
            wbps: 4e8,
            wseqiops: 30_000.0,
            wrandiops: 9_000.0,
        };
        let got = cost_model(
            &points(&truth, IoKind::Read),
            Some(&points(&truth, IoKind::Write)),
        );
        for (a, b) in [
            (got.rbps, truth.rbps),
            (got.rseqiops, truth.rseqiops),
            (got.rrandiops, truth.rrandiops),
            (got.wbps, truth.wbps),
            (got.wseqiops, truth.wseqiops),
            (got.wrandiops, truth.wrandiops),
        ] {
            assert!((a / b - 1.0).abs() < 1e-6, "{a} vs {b}");
        }
        let mix = predicted_iops(&truth, 70, &[4096]);
        let by_hand = 1e9
            / (0.7 * truth.cost(IoKind::Read, 4096, false)
                + 0.3 * truth.cost(IoKind::Write, 4096, false));
        assert!((mix - by_hand).abs() < 1e-6);
        // Two sizes: one over the mean of their times, not the mean of their rates.
        let split = predicted_iops(&truth, 100, &[4096, 65536]);
        let ns =
            (truth.cost(IoKind::Read, 4096, false) + truth.cost(IoKind::Read, 65536, false)) / 2.0;
        assert!((split - 1e9 / ns).abs() < 1e-6);
    }

    #[test]
    fn the_byte_cost_weighs_each_point_by_its_relative_error() {
        // Exactly linear points give the line back, with or without the mid one.
        let t = |bytes: u32| 5e-6 + f64::from(bytes) / 1.2e9;
        let exact = [
            (SMALL, t(SMALL)),
            (128 << 10, t(128 << 10)),
            (1 << 20, t(1 << 20)),
        ];
        assert!((byte_cost(&exact) * 1.2e9 - 1.0).abs() < 1e-9);
        assert!((byte_cost(&[exact[0], exact[2]]) * 1.2e9 - 1.0).abs() < 1e-9);
        // 1 MiB IOs 20% slower than the line (this disk on 2026-11-25/26):
        // the two-point cost follows them all the way; with the mid point
        // about half the way (each point's relative error counts alike).
        let slow = [exact[0], exact[1], (1 << 20, 1.2 * t(1 << 20))];
        let two = byte_cost(&[slow[0], slow[2]]) * 1.2e9;
        let three = byte_cost(&slow) * 1.2e9;
        assert!(two > 1.19, "two points: {two}");
        assert!(three > 1.0 && three < 1.1, "three points: {three}");
        // Degenerate input gives no byte cost (the caller falls back).
        assert_eq!(byte_cost(&[(SMALL, 1e-5)]), 0.0);
    }

    #[test]
    fn noise_that_inverts_the_byte_cost_falls_back() {
        // Large IOs no slower per IO than small ones: no byte cost to see.
        let p = CostPoints {
            seq_small_iops: 1000.0,
            seq_large_iops: 1000.0,
            rand_small_iops: 800.0,
        };
        let (bps, seq, rand) = solve_direction(&p);
        assert!((bps - 1000.0 * f64::from(LARGE)).abs() < 1.0);
        assert!(seq > 0.0 && rand > 0.0 && rand < seq);
    }

    #[test]
    fn unloaded_latency_is_a_line_in_the_size() {
        let u = Unloaded::through(100e-6, 100e-6 + f64::from(LARGE - SMALL) * 1e-9);
        assert!((u.per_byte_s - 1e-9).abs() < 1e-15);
        assert!((u.of(SMALL) - 100e-6).abs() < 1e-12);
        assert!((u.of(65536) - (100e-6 + 61440e-9)).abs() < 1e-12);
        // A large IO no slower than a small one: flat.
        let flat = Unloaded::through(100e-6, 90e-6);
        assert_eq!((flat.per_byte_s, flat.of(LARGE)), (0.0, 100e-6));
        // A mix: the mean over its directions and sizes.
        let w = Unloaded::through(200e-6, 200e-6);
        let mix = mix_unloaded_s(&u, &w, 70, &[SMALL, 65536]);
        let by_hand = 0.7 * (u.of(SMALL) + u.of(65536)) / 2.0 + 0.3 * 200e-6;
        assert!((mix - by_hand).abs() < 1e-12);
    }

    #[test]
    fn a_qd_below_the_knee_is_latency_bound_and_above_it_capacity_bound() {
        // 25 us an IO when busy (40k IOPS), 225 us alone: half the capacity at QD 8.
        let (cost, alone) = (25e-6, 225e-6);
        assert!((iops_at_qd(cost, alone, 1) - 1.0 / alone).abs() < 1e-6);
        assert!((iops_at_qd(cost, alone, 8) - 20_000.0).abs() < 1e-6);
        assert!((share_of_capacity(cost, alone, 8) - 0.5).abs() < 1e-12);
        // Never above either bound, and approaching the capacity.
        for qd in [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024] {
            let x = iops_at_qd(cost, alone, qd);
            assert!(
                x <= 1.0 / cost && x <= f64::from(qd) / alone + 1e-9,
                "QD {qd}: {x}"
            );
        }
        assert!(share_of_capacity(cost, alone, 1024) > 0.99);
        // An IO alone no slower than the busy device's rate: the capacity at every QD.
        assert!((iops_at_qd(cost, 0.0, 1) - 40_000.0).abs() < 1e-6);
        assert!((iops_at_qd(cost, 0.0, 64) - 40_000.0).abs() < 1e-6);
    }

    #[test]
    fn a_point_below_its_knee_is_taken_back_to_its_capacity() {
        let (cost, alone) = (25e-6, 225e-6);
        for qd in [16, 64, 256] {
            let rate = iops_at_qd(cost, alone, qd);
            let back = saturated_cost_s(rate, qd, alone);
            assert!((back - cost).abs() < 1e-12, "QD {qd}: {back}");
        }
        // Saturated where measured: the point's own time.
        assert_eq!(saturated_cost_s(1000.0, 64, 1e-3), 1e-3);
        assert_eq!(saturated_cost_s(1000.0, 1, 5e-3), 1e-3);
        // Far below the knee: at most half taken away.
        assert_eq!(saturated_cost_s(1000.0, 2, 1.9e-3), 0.5e-3);
    }

    #[test]
    fn knee_is_the_first_qd_near_the_top() {
        let curve = [
            (1, 10.0),
            (2, 19.0),
            (4, 36.0),
            (8, 58.0),
            (16, 61.0),
            (32, 60.0),
        ];
        assert_eq!(knee(&curve), Some(8));
        assert_eq!(knee(&[]), None);
    }
}
