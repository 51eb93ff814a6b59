//! iocost's linear device model: what an IO costs the device, in
//! nanoseconds of device time, from six parameters.

use serde::{Deserialize, Serialize};

use crate::IoKind;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// Read bytes per second.
    pub rbps: f64,
    pub rseqiops: f64,
    pub rrandiops: f64,
    pub wbps: f64,
    pub wseqiops: f64,
    pub wrandiops: f64,
}

impl Default for CostModel {
    /// A data-centre NVMe drive: 2.8 GB/s and 550k random IOPS for reads.
    fn default() -> Self {
        CostModel::nvme()
    }
}

impl CostModel {
    pub fn nvme() -> CostModel {
        CostModel {
            rbps: 2.8e9,
            rseqiops: 600e3,
            rrandiops: 550e3,
            wbps: 2.0e9,
            wseqiops: 500e3,
            wrandiops: 450e3,
        }
    }

    /// Memory-backed devices: cost is nearly all bytes.
    pub fn memory() -> CostModel {
        CostModel {
            rbps: 8e9,
            rseqiops: 4e6,
            rrandiops: 4e6,
            wbps: 6e9,
            wseqiops: 4e6,
            wrandiops: 4e6,
        }
    }

    /// The six parameters with their config names, in config order.
    pub fn named(&self) -> [(&'static str, f64); 6] {
        [
            ("rbps", self.rbps),
            ("rseqiops", self.rseqiops),
            ("rrandiops", self.rrandiops),
            ("wbps", self.wbps),
            ("wseqiops", self.wseqiops),
            ("wrandiops", self.wrandiops),
        ]
    }

    /// Device nanoseconds for one IO. `sequential`: it starts where the
    /// previous one ended.
    pub fn cost(&self, kind: IoKind, bytes: u32, sequential: bool) -> f64 {
        let (per_io, per_byte) = self.units(kind, sequential);
        per_io + f64::from(bytes) * per_byte
    }

    /// Device nanoseconds per IO and per byte: `cost` is the first plus
    /// the second times the bytes, so a caller that costs many IOs can
    /// keep these and skip the divisions.
    pub fn units(&self, kind: IoKind, sequential: bool) -> (f64, f64) {
        let (bps, seq, rand) = match kind {
            IoKind::Read => (self.rbps, self.rseqiops, self.rrandiops),
            IoKind::Write => (self.wbps, self.wseqiops, self.wrandiops),
        };
        let iops = if sequential { seq } else { rand };
        let per_io = if iops > 0.0 { 1e9 / iops } else { 0.0 };
        let per_byte = if bps > 0.0 { 1e9 / bps } else { 0.0 };
        (per_io, per_byte)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_grows_with_size_and_randomness() {
        let m = CostModel::nvme();
        let small = m.cost(IoKind::Read, 4096, false);
        let big = m.cost(IoKind::Read, 131072, false);
        assert!(big > small * 10.0);
        assert!(m.cost(IoKind::Read, 4096, true) < small);
        assert!(m.cost(IoKind::Write, 4096, false) > small);
        let zero = CostModel { rbps: 0.0, ..m };
        assert!(zero.cost(IoKind::Read, 4096, false).is_finite());
    }
}
