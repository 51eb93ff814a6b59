//! Measures a tune sweep's points: the QD 1 probe alone, and beside the
//! adversary held by a knob, in process (the driver) or served (`iopace
//! serve` and fio, [`crate::served`]); each point saved as it ends.

use std::path::Path;

use pace::pacer::CostModel;

use crate::converge::StopRule;
use crate::driver::{measure_jobs, Job, JobStats, Throttle};
use crate::served::{depth_qos, pinned_qos, Served, ADVERSARY_QD};
use crate::tune_point::{budget_iops, rand4k, Knob, TunePoint};
use crate::tune_store::saved_or;
use crate::{ProbeError, Target};

/// Measures solo and points, in process or served.
pub(crate) struct Measurer<'a> {
    /// The device opened here: in process only.
    pub t: Option<&'a Target>,
    pub cost: CostModel,
    pub rule: StopRule,
    pub served: Option<&'a Served>,
}

impl Measurer<'_> {
    /// The device, for measuring in process.
    fn in_process(&self) -> Result<&Target, ProbeError> {
        self.t
            .ok_or_else(|| ProbeError::Run("measuring in process needs the device open".into()))
    }

    fn probe_job(&self) -> Result<Job, ProbeError> {
        Ok(Job {
            dev: self.in_process()?.bdev.clone(),
            qd: 1,
            workload: rand4k(),
            throttle: None,
        })
    }

    /// The QD 1 probe alone.
    pub fn solo(&self) -> Result<JobStats, ProbeError> {
        if let Some(s) = self.served {
            return Ok(s
                .run("solo", self.cost, None, false)
                .map_err(ProbeError::Run)?
                .probe);
        }
        let jobs = measure_jobs(&[self.probe_job()?], &self.rule).map_err(ProbeError::Run)?;
        Ok(jobs.1[0])
    }

    /// The probe beside the adversary held by `knob` (served: a run
    /// called `name`).
    fn point(&self, knob: Knob, name: &str, solo: JobStats) -> Result<TunePoint, ProbeError> {
        let (v, depth) = match knob {
            Knob::Untuned => (0.0, None),
            Knob::Vrate(v) => (v, None),
            Knob::Depth(n) => (0.0, Some(n)),
        };
        let point = |adversary: JobStats, probe: JobStats| TunePoint {
            vrate: v,
            budget_iops: budget_iops(self.cost, v),
            adversary,
            probe,
            isolation: probe.p99_us / solo.p99_us.max(1e-3),
            vrate_held: None,
            cpu_us_per_io: None,
            served: self.served.is_some(),
            light_depth: depth,
            runs: 1,
        };
        if let Some(s) = self.served {
            let qos = match knob {
                Knob::Untuned => None,
                Knob::Vrate(v) => Some(pinned_qos(v)),
                Knob::Depth(n) => Some(depth_qos(n)),
            };
            let o = s.run(name, self.cost, qos, true).map_err(ProbeError::Run)?;
            let adversary = o
                .adversary
                .ok_or(ProbeError::Run("no adversary job".into()))?;
            return Ok(TunePoint {
                vrate_held: o.vrate_held,
                cpu_us_per_io: o.cpu_us_per_io,
                ..point(adversary, o.probe)
            });
        }
        // In process a cap is the adversary's own queue depth.
        let adversary = Job {
            dev: self.in_process()?.bdev.clone(),
            qd: depth.unwrap_or(ADVERSARY_QD),
            workload: rand4k(),
            throttle: (knob != Knob::Untuned && depth.is_none()).then_some(Throttle {
                cost: self.cost,
                vrate: v / 100.0,
            }),
        };
        let (_, jobs) =
            measure_jobs(&[adversary, self.probe_job()?], &self.rule).map_err(ProbeError::Run)?;
        Ok(point(jobs[0], jobs[1]))
    }
}

impl Measurer<'_> {
    /// The point at `knob`, saved in `dir` (or read back from an earlier run).
    pub fn saved_point(
        &self,
        dir: &Path,
        knob: Knob,
        solo: JobStats,
    ) -> Result<TunePoint, ProbeError> {
        self.saved_run(dir, knob, &knob.key(), solo)
    }

    pub fn saved_run(
        &self,
        dir: &Path,
        knob: Knob,
        name: &str,
        solo: JobStats,
    ) -> Result<TunePoint, ProbeError> {
        saved_or(&dir.join(format!("{name}.json")), || {
            self.point(knob, name, solo)
        })
    }
}
