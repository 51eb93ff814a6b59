//! Delay layers, with the semantics of SPDK's delay bdev: every IO is held
//! for the average latency, except one in a hundred, held for the p99
//! latency. The reactor applies the hold with timers.

use rand::Rng;

use crate::IoOp;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayModel {
    read_avg_ns: u64,
    read_p99_ns: u64,
    write_avg_ns: u64,
    write_p99_ns: u64,
}

impl DelayModel {
    /// Latencies in microseconds; p99 must not be below the average.
    pub fn new(
        read_avg_us: u64,
        read_p99_us: u64,
        write_avg_us: u64,
        write_p99_us: u64,
    ) -> Result<DelayModel, (&'static str, String)> {
        let limit = 60_000_000; // a minute
        for (field, v) in [
            ("read_avg_us", read_avg_us),
            ("read_p99_us", read_p99_us),
            ("write_avg_us", write_avg_us),
            ("write_p99_us", write_p99_us),
        ] {
            if v > limit {
                return Err((field, format!("{v} us is more than a minute")));
            }
        }
        if read_p99_us < read_avg_us {
            return Err((
                "read_p99_us",
                format!("{read_p99_us} is below read_avg_us {read_avg_us}"),
            ));
        }
        if write_p99_us < write_avg_us {
            return Err((
                "write_p99_us",
                format!("{write_p99_us} is below write_avg_us {write_avg_us}"),
            ));
        }
        Ok(DelayModel {
            read_avg_ns: read_avg_us * 1000,
            read_p99_ns: read_p99_us * 1000,
            write_avg_ns: write_avg_us * 1000,
            write_p99_ns: write_p99_us * 1000,
        })
    }

    pub fn sample_ns(&self, op: IoOp, rng: &mut impl Rng) -> u64 {
        let (avg, p99) = match op {
            IoOp::Read | IoOp::Cache => (self.read_avg_ns, self.read_p99_ns),
            IoOp::Write { .. } | IoOp::Trim { .. } | IoOp::WriteZeroes { .. } | IoOp::Flush => {
                (self.write_avg_ns, self.write_p99_ns)
            }
        };
        if p99 > avg && rng.gen_range(0..100u32) == 0 {
            p99
        } else {
            avg
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn one_in_a_hundred_gets_p99() {
        let d = DelayModel::new(1000, 5000, 200, 200).expect("valid");
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 100_000;
        let slow = (0..n)
            .filter(|_| d.sample_ns(IoOp::Read, &mut rng) == 5_000_000)
            .count();
        assert!((800..1200).contains(&slow), "{slow}");
        assert_eq!(d.sample_ns(IoOp::Write { fua: false }, &mut rng), 200_000);
        assert!(DelayModel::new(10, 5, 0, 0).is_err());
    }
}
