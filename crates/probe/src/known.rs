//! Points a probe has measured already, so a later phase does not measure
//! them again. The peak searches climb QD 1, 2, 4, ... of 4 KiB random
//! reads and writes and 128 KiB sequential reads: the QD curves' own
//! workloads at the curves' own QDs; the 4 KiB random read curve's QD 64
//! is the thread scaling's one thread. (A search point runs three windows,
//! a curve point until its windows agree: a reused point is the shorter.)

use crate::driver::{Measurement, Workload};

/// Measurements of one job of a workload at a QD.
#[derive(Debug, Clone, Default)]
pub struct Known {
    points: Vec<(Workload, u32, Measurement)>,
}

impl Known {
    pub fn new() -> Known {
        Known::default()
    }

    /// Keeps `m`, the measurement of `w` at `qd` (the latest of several).
    pub fn add(&mut self, w: Workload, qd: u32, m: Measurement) {
        self.points.retain(|p| !(p.0 == w && p.1 == qd));
        self.points.push((w, qd, m));
    }

    pub fn get(&self, w: &Workload, qd: u32) -> Option<Measurement> {
        self.points
            .iter()
            .find(|p| p.0 == *w && p.1 == qd)
            .map(|p| p.2)
    }

    /// The measurement of `w` at `qd`: the one known, or `measure`d now
    /// and kept; with whether it was known.
    pub fn or_measure<E>(
        &mut self,
        w: Workload,
        qd: u32,
        measure: impl FnOnce() -> Result<Measurement, E>,
    ) -> Result<(Measurement, bool), E> {
        if let Some(m) = self.get(&w, qd) {
            return Ok((m, true));
        }
        let m = measure()?;
        self.add(w, qd, m);
        Ok((m, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{test_round, workload};

    #[test]
    fn a_point_known_is_not_measured_again() {
        let mut k = Known::new();
        let read = workload(100, 4096, true);
        let write = workload(0, 4096, true);
        k.add(read, 4, test_round(10.0, 1.0));
        let mut measured = 0;
        let mut at = |w, qd| {
            k.or_measure(w, qd, || {
                measured += 1;
                Ok::<_, ()>(test_round(20.0, 1.0))
            })
        };
        assert_eq!(
            at(read, 4).map(|(m, known)| (m.iops, known)),
            Ok((10.0, true))
        );
        assert_eq!(
            at(read, 8).map(|(m, known)| (m.iops, known)),
            Ok((20.0, false))
        );
        assert_eq!(
            at(write, 4).map(|(m, known)| (m.iops, known)),
            Ok((20.0, false))
        );
        assert_eq!(at(read, 8).map(|(_, known)| known), Ok(true));
        assert_eq!(measured, 2);
        // The latest of two.
        k.add(read, 4, test_round(30.0, 1.0));
        assert_eq!(k.get(&read, 4).map(|m| m.iops), Some(30.0));
    }
}
