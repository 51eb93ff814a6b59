//! The `model` bdev: a synthetic device whose behaviour is known exactly, the
//! ground truth for `iopace probe` and `iopace tune`.
//!
//! Every IO occupies one of `channels` channels from admission to completion,
//! and the device's shared capacity for its cost under iocost's linear model
//! (the pacer's [`CostModel`]), served one after another. It then takes a
//! fixed latency, plus `knee_us` for each IO in flight beyond `knee_qd`. So
//! at QD 1 an IO takes cost + latency, and with enough IOs in flight the
//! device delivers exactly the cost model's rate.
//!
//! The timing is a pure function of the state, the IO and the time given;
//! the bdev wraps it with a clock and a lock, since reactors share a device.

use std::sync::Mutex;
use std::time::Instant;

use types::{CostModel, IoKind};

use crate::IoOp;

/// What a model device is: its cost model and latency shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelParams {
    pub cost: CostModel,
    /// Fixed latency every IO takes after its service, in nanoseconds.
    pub latency_ns: u64,
    /// IOs the device works on at once; more wait for a channel.
    pub channels: u32,
    /// In-flight IOs past which latency grows (0: it never grows).
    pub knee_qd: u32,
    /// Extra nanoseconds per in-flight IO beyond `knee_qd`.
    pub knee_ns: u64,
}

impl ModelParams {
    /// Checks the values a config gives; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, v) in self.cost.named() {
            if !(v.is_finite() && v > 0.0) {
                return Err((
                    "cost",
                    format!("{field} must be a positive number, got {v}"),
                ));
            }
        }
        if self.channels == 0 || self.channels > 4096 {
            return Err((
                "channels",
                format!("must be 1..=4096, got {}", self.channels),
            ));
        }
        if self.latency_ns > 60_000_000_000 || self.knee_ns > 60_000_000_000 {
            return Err(("latency_us", "more than a minute".into()));
        }
        Ok(())
    }

    /// The parameters a `kind = "model"` spec gives.
    pub fn from_spec(s: &crate::ModelSpec) -> Result<ModelParams, (&'static str, String)> {
        let Some(cost) = s.cost else {
            return Err((
                "cost",
                "a model bdev needs cost = { rbps = ..., ... }".into(),
            ));
        };
        let us = |field: &'static str, v: Option<f64>| match v {
            None => Ok(0),
            Some(v) if v.is_finite() && (0.0..=60e6).contains(&v) => Ok((v * 1000.0) as u64),
            Some(v) => Err((field, format!("must be 0 to 60000000 us, got {v}"))),
        };
        let p = ModelParams {
            cost,
            latency_ns: us("latency_us", s.latency_us)?,
            channels: s.channels.unwrap_or(256),
            knee_qd: s.knee_qd.unwrap_or(0),
            knee_ns: us("knee_us", s.knee_us)?,
        };
        p.validate()?;
        Ok(p)
    }

    /// Device time of one IO under the cost model, in nanoseconds.
    pub fn service_ns(&self, kind: IoKind, bytes: u32, sequential: bool) -> f64 {
        self.cost.cost(kind, bytes, sequential)
    }

    /// Steady-state IOs per second of one IO shape at `qd` IOs in flight: the
    /// smaller of what `qd` IOs of cost + latency give and the cost model's rate.
    pub fn expected_iops(&self, kind: IoKind, bytes: u32, sequential: bool, qd: u32) -> f64 {
        let service = self.service_ns(kind, bytes, sequential);
        let inflight = qd.min(self.channels);
        // Each IO past the knee adds queueing; below it, none (a clamp).
        let extra = u64::from(inflight.saturating_sub(self.knee_qd)) * self.knee_ns;
        let per_io_ns =
            service + (self.latency_ns + if self.knee_qd > 0 { extra } else { 0 }) as f64;
        (f64::from(inflight) * 1e9 / per_io_ns).min(1e9 / service)
    }
}

/// Where the device is: when each channel frees, when the shared capacity
/// frees, and where the last read and write ended (for sequentiality).
#[derive(Debug, Clone)]
pub struct ModelState {
    channel_free_ns: Vec<u64>,
    capacity_free_ns: f64,
    last_end: [u64; 2],
}

impl ModelState {
    pub fn new(params: &ModelParams) -> ModelState {
        ModelState {
            channel_free_ns: vec![0; params.channels as usize],
            capacity_free_ns: 0.0,
            last_end: [u64::MAX; 2],
        }
    }

    /// Admits one IO at `now_ns`; returns when it completes.
    pub fn admit(&mut self, p: &ModelParams, now_ns: u64, op: IoOp, offset: u64, len: u32) -> u64 {
        let (channel, &free) = self
            .channel_free_ns
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| **t)
            .expect("a model has at least one channel");
        let start = free.max(now_ns);
        let in_flight = self.channel_free_ns.iter().filter(|t| **t > start).count() as u32 + 1;
        let service = match op_shape(op, len) {
            Some((kind, bytes)) => {
                let k = kind as usize;
                let sequential = self.last_end[k] == offset;
                self.last_end[k] = offset + u64::from(len);
                p.service_ns(kind, bytes, sequential)
            }
            None => 0.0,
        };
        self.capacity_free_ns = self.capacity_free_ns.max(start as f64) + service;
        let extra = if p.knee_qd > 0 {
            // IOs past the knee, none below it (a clamp).
            u64::from(in_flight.saturating_sub(p.knee_qd)) * p.knee_ns
        } else {
            0
        };
        let done = self.capacity_free_ns.ceil() as u64 + p.latency_ns + extra;
        debug_assert!(done >= now_ns);
        self.channel_free_ns[channel] = done;
        done
    }
}

/// The cost class of an op: data ops cost by their length, flush only waits.
fn op_shape(op: IoOp, len: u32) -> Option<(IoKind, u32)> {
    match op {
        IoOp::Read | IoOp::Cache => Some((IoKind::Read, len)),
        IoOp::Write { .. } => Some((IoKind::Write, len)),
        IoOp::Trim { .. } | IoOp::WriteZeroes { .. } => Some((IoKind::Write, 0)),
        IoOp::Flush => None,
    }
}

/// A model device as bdevs share it: parameters, state and its clock.
#[derive(Debug)]
pub struct ModelDevice {
    pub params: ModelParams,
    state: Mutex<ModelState>,
    origin: Instant,
}

thread_local! {
    /// The hold computed by the last [`ModelDevice::admit_now`] on this
    /// thread. A memory leaf completes inside `prepare`, and the caller asks
    /// for the hold right after with only the op; `prepare` saw the offset
    /// and length, so it leaves the hold here for that call.
    static PENDING_HOLD_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl ModelDevice {
    pub fn new(params: ModelParams) -> ModelDevice {
        ModelDevice {
            params,
            state: Mutex::new(ModelState::new(&params)),
            origin: Instant::now(),
        }
    }

    /// Admits an IO now and leaves its hold for [`take_pending_hold_ns`].
    pub(crate) fn admit_now(&self, op: IoOp, offset: u64, len: u32) {
        let now = self.origin.elapsed().as_nanos() as u64;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let done = state.admit(&self.params, now, op, offset, len);
        PENDING_HOLD_NS.with(|h| h.set(done - now));
    }
}

/// The hold left by this thread's last model admission (0 if none), cleared.
pub(crate) fn take_pending_hold_ns() -> u64 {
    PENDING_HOLD_NS.with(|h| h.replace(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(channels: u32) -> ModelParams {
        ModelParams {
            cost: CostModel {
                rbps: 1e9,
                rseqiops: 100_000.0,
                rrandiops: 50_000.0,
                wbps: 5e8,
                wseqiops: 40_000.0,
                wrandiops: 20_000.0,
            },
            latency_ns: 100_000,
            channels,
            knee_qd: 0,
            knee_ns: 0,
        }
    }

    /// Runs a closed loop of `qd` IOs for `n` completions; returns IOPS.
    fn closed_loop(p: &ModelParams, qd: u32, n: usize, op: IoOp, random: bool) -> f64 {
        let mut s = ModelState::new(p);
        let mut pending: std::collections::BinaryHeap<std::cmp::Reverse<u64>> = Default::default();
        let mut offset = 0u64;
        let next = |o: &mut u64| {
            let at = if random {
                (*o * 7919 + 13) % 100_000 * 8192
            } else {
                *o * 4096
            };
            *o += 1;
            at
        };
        for _ in 0..qd {
            let at = next(&mut offset);
            pending.push(std::cmp::Reverse(s.admit(p, 0, op, at, 4096)));
        }
        let mut last = 0;
        for _ in 0..n {
            let std::cmp::Reverse(t) = pending.pop().expect("in flight");
            last = t;
            let at = next(&mut offset);
            pending.push(std::cmp::Reverse(s.admit(p, t, op, at, 4096)));
        }
        n as f64 * 1e9 / last as f64
    }

    #[test]
    fn qd1_latency_is_service_plus_latency() {
        let p = params(8);
        let mut s = ModelState::new(&p);
        let done = s.admit(&p, 1_000, IoOp::Read, 8192, 4096);
        let service: f64 = 1e9 / 50_000.0 + 4096.0;
        assert_eq!(done, 1_000 + service.ceil() as u64 + 100_000);
        // The next read starts where that one ended: sequential, cheaper.
        let t = done;
        let done2 = s.admit(&p, t, IoOp::Read, 12288, 4096);
        assert_eq!(done2 - t, (1e4 + 4096.0f64).ceil() as u64 + 100_000);
    }

    #[test]
    fn saturated_rate_is_the_cost_models() {
        let p = params(64);
        let iops = closed_loop(&p, 64, 20_000, IoOp::Read, true);
        let want = 1e9 / p.service_ns(IoKind::Read, 4096, false);
        assert!((iops / want - 1.0).abs() < 0.01, "{iops} vs {want}");
        let w = closed_loop(&p, 64, 20_000, IoOp::Write { fua: false }, false);
        let want = 1e9 / p.service_ns(IoKind::Write, 4096, true);
        assert!((w / want - 1.0).abs() < 0.01, "{w} vs {want}");
    }

    #[test]
    fn closed_loop_matches_expected_iops_at_every_qd() {
        let mut p = params(16);
        p.knee_qd = 4;
        p.knee_ns = 20_000;
        for qd in [1, 2, 4, 8, 16, 32] {
            let got = closed_loop(&p, qd, 5_000, IoOp::Read, true);
            let want = p.expected_iops(IoKind::Read, 4096, false, qd);
            assert!((got / want - 1.0).abs() < 0.03, "qd {qd}: {got} vs {want}");
        }
    }

    #[test]
    fn channels_cap_parallelism() {
        let p = params(2);
        let two = closed_loop(&p, 2, 2_000, IoOp::Read, true);
        let many = closed_loop(&p, 32, 2_000, IoOp::Read, true);
        assert!((many / two - 1.0).abs() < 0.01, "{two} vs {many}");
    }

    #[test]
    fn built_model_bdev_holds_its_ios() {
        let build = |t: &[crate::BdevTable]| crate::build(&crate::specs(t)?);
        let mut base = crate::BdevTable::new("m", crate::BdevKindName::Null);
        base.size = Some(crate::ByteSize(1 << 30));
        let mut model = crate::BdevTable::new("dev", crate::BdevKindName::Model);
        model.base = Some("m".into());
        assert_eq!(
            build(&[base.clone(), model.clone()]).unwrap_err().field,
            "cost"
        );
        model.cost = Some(params(4).cost);
        model.latency_us = Some(100.0);
        let set = build(&[base, model]).expect("build");
        let dev = set.get("dev").expect("dev");
        assert!(dev.has_delay());
        let mut buf = vec![0u8; 4096];
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let io = crate::IoRequest {
            op: IoOp::Read,
            offset: 1 << 20,
            len: 4096,
            iov: iov.as_ptr(),
            iovcnt: 1,
        };
        // SAFETY: iov describes `buf`, alive for the whole test.
        assert!(matches!(unsafe { dev.prepare(&io) }, crate::Prep::Done(_)));
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let hold = dev.sample_delay_ns(IoOp::Read, &mut rng);
        assert!((120_000..10_000_000).contains(&hold), "{hold}");
        // The hold is handed over once.
        assert_eq!(dev.sample_delay_ns(IoOp::Read, &mut rng), 0);
    }

    #[test]
    fn bad_params_name_the_field() {
        let mut p = params(0);
        assert_eq!(p.validate().unwrap_err().0, "channels");
        p.channels = 1;
        p.cost.wbps = 0.0;
        let (field, message) = p.validate().unwrap_err();
        assert_eq!(field, "cost");
        assert!(message.starts_with("wbps"), "{message}");
    }
}
