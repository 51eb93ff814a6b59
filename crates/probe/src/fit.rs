//! From measured rates to the device's numbers: the six parameters of the
//! linear cost model, the knee of a QD curve, and what the model predicts.

use pace::pacer::{CostModel, IoKind};

/// The block size of the small IOs the IOPS parameters are measured with.
pub const SMALL: u32 = 4096;
/// The block size of the large sequential IOs the bandwidth is measured with.
pub const LARGE: u32 = 1 << 20;

/// Saturated rates (IOs per second) of one direction's three cost points.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostPoints {
    pub seq_small_iops: f64,
    pub seq_large_iops: f64,
    pub rand_small_iops: f64,
}

/// One direction's parameters `(bps, seqiops, randiops)`, solving the
/// model's per-IO time `1/iops + bytes/bps` for the three points: the two
/// sequential sizes give the byte cost and the sequential IO cost, the
/// random one its IO cost. A byte cost lost in noise falls back to the large
/// IOs' bandwidth; an IO cost lost in noise to the small IOs' rate.
pub fn solve_direction(p: &CostPoints) -> (f64, f64, f64) {
    let t_seq_small = 1.0 / p.seq_small_iops;
    let t_seq_large = 1.0 / p.seq_large_iops;
    let t_rand_small = 1.0 / p.rand_small_iops;
    let per_byte = (t_seq_large - t_seq_small) / f64::from(LARGE - SMALL);
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
