//! Fault layers (`kind = "fault"`): a bdev over a base that fails, slows
//! or stalls chosen IOs, for users testing how their clients take a failing
//! device (as nbdkit's error and delay filters, or SPDK's error bdev).
//!
//! Errors are decided in [`Fault::fail`], before the base sees the IO: a
//! failed IO never reaches the device. Latency and stalls are holds on the
//! completion, applied by the engine's timers like a delay layer's, so no
//! thread ever sleeps. The parameters may change at run time
//! ([`Fault::set`], the `set_fault` RPC), so they sit behind a mutex that
//! only IOs of fault bdevs take; the counters are atomics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::{ByteSize, IoOp};

/// The operations a fault layer may hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Trim,
    Zeroes,
    Cache,
}

impl FaultOp {
    const ALL: [FaultOp; 6] = [
        FaultOp::Read,
        FaultOp::Write,
        FaultOp::Flush,
        FaultOp::Trim,
        FaultOp::Zeroes,
        FaultOp::Cache,
    ];

    fn of(op: IoOp) -> FaultOp {
        match op {
            IoOp::Read => FaultOp::Read,
            IoOp::Write { .. } => FaultOp::Write,
            IoOp::Flush => FaultOp::Flush,
            IoOp::Trim { .. } => FaultOp::Trim,
            IoOp::WriteZeroes { .. } => FaultOp::Zeroes,
            IoOp::Cache => FaultOp::Cache,
        }
    }
}

/// The error a failed IO returns: the NBD protocol's error values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Errno {
    Eperm,
    #[default]
    Eio,
    Enomem,
    Einval,
    Enospc,
    Eoverflow,
    Enotsup,
    Eshutdown,
}

impl Errno {
    /// The NBD error value on the wire.
    pub fn value(self) -> u32 {
        match self {
            Errno::Eperm => proto::EPERM,
            Errno::Eio => proto::EIO,
            Errno::Enomem => proto::ENOMEM,
            Errno::Einval => proto::EINVAL,
            Errno::Enospc => proto::ENOSPC,
            Errno::Eoverflow => proto::EOVERFLOW,
            Errno::Enotsup => proto::ENOTSUP,
            Errno::Eshutdown => proto::ESHUTDOWN,
        }
    }
}

/// Bytes of the fault bdev that IOs touching them fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FailRange {
    pub offset: ByteSize,
    pub length: ByteSize,
}

impl FailRange {
    fn touches(&self, offset: u64, len: u32) -> bool {
        let end = self.offset.0.saturating_add(self.length.0);
        len > 0 && offset < end && self.offset.0 < offset.saturating_add(u64::from(len))
    }
}

/// What a fault layer does, as the config and `set_fault` give it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultParams {
    /// The operations every fault below hits (default: all).
    pub ops: Vec<FaultOp>,
    /// What a failed IO returns.
    pub errno: Errno,
    /// Share of IOs that fail, from 0 to 1.
    pub error_rate: f64,
    /// IOs touching these bytes fail.
    pub fail_range: Option<FailRange>,
    /// After this many IOs (counted from the last time it was set), every IO fails.
    pub fail_after: Option<u64>,
    /// Added to every IO's completion.
    pub latency_us: f64,
    /// Added to a share `spike_rate` of IOs on top of `latency_us`.
    pub spike_us: f64,
    pub spike_rate: f64,
    /// IO completions are held until this is set back to false.
    pub stall: bool,
    /// IO completions are held until this many milliseconds after it is set.
    pub stall_ms: u64,
}

impl Default for FaultParams {
    fn default() -> Self {
        FaultParams {
            ops: FaultOp::ALL.to_vec(),
            errno: Errno::Eio,
            error_rate: 0.0,
            fail_range: None,
            fail_after: None,
            latency_us: 0.0,
            spike_us: 0.0,
            spike_rate: 0.0,
            stall: false,
            stall_ms: 0,
        }
    }
}

/// Longest added latency or spike: a minute, as a delay layer's.
const MAX_LATENCY_US: f64 = 60e6;
/// Longest timed stall: an hour.
const MAX_STALL_MS: u64 = 3_600_000;

impl FaultParams {
    /// Checks the values serde cannot: which field is wrong and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.ops.is_empty() {
            return Err(("ops", "must name at least one operation".into()));
        }
        for (field, v) in [
            ("error_rate", self.error_rate),
            ("spike_rate", self.spike_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err((field, format!("{v} is not a share from 0 to 1")));
            }
        }
        for (field, v) in [("latency_us", self.latency_us), ("spike_us", self.spike_us)] {
            if !(0.0..=MAX_LATENCY_US).contains(&v) {
                return Err((field, format!("{v} us is not from 0 to a minute")));
            }
        }
        if self.stall_ms > MAX_STALL_MS {
            return Err((
                "stall_ms",
                format!("{} ms is more than an hour", self.stall_ms),
            ));
        }
        match self.fail_range {
            Some(r) if r.length.0 == 0 => Err(("fail_range", "length must be more than 0".into())),
            Some(r) if r.offset.0.checked_add(r.length.0).is_none() => {
                Err(("fail_range", "offset + length overflows 64 bits".into()))
            }
            _ => Ok(()),
        }
    }

    fn hits(&self, op: IoOp) -> bool {
        self.ops.contains(&FaultOp::of(op))
    }
}

/// `stall_until` for a stall held until released.
const HELD: u64 = u64::MAX;
/// How often a held IO looks whether its stall was released.
pub const STALL_RECHECK_NS: u64 = 10_000_000;

/// One fault layer, shared by every reactor serving it.
#[derive(Debug)]
pub struct Fault {
    name: String,
    /// Where the fault bdev's byte 0 lies on its leaf.
    origin: u64,
    params: Mutex<FaultParams>,
    /// Engine time a stall ends at: 0 none, [`HELD`] until released.
    stall_until: AtomicU64,
    /// IOs of the chosen operations since `fail_after` was last set.
    ios: AtomicU64,
    errors: AtomicU64,
    held: AtomicU64,
    rng: AtomicU64,
}

/// A fault layer's parameters and counters, for `get_faults`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultStatus {
    pub bdev: String,
    pub params: FaultParams,
    /// IOs of the chosen operations since `fail_after` was last set.
    pub ios: u64,
    /// IOs failed by this layer.
    pub errors: u64,
    /// IOs held by a stall.
    pub held: u64,
    /// "no", "held" (until released), or the milliseconds left.
    pub stall: String,
}

impl Fault {
    pub(crate) fn new(name: &str, origin: u64, params: FaultParams) -> Fault {
        let f = Fault {
            name: name.to_string(),
            origin,
            params: Mutex::new(FaultParams::default()),
            stall_until: AtomicU64::new(0),
            ios: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            held: AtomicU64::new(0),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        };
        f.set(params, 0, true);
        f
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultParams> {
        self.params.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn params(&self) -> FaultParams {
        self.lock().clone()
    }

    /// Puts `p` in force at engine time `now`. A timed stall window
    /// (re)starts only when `restart_window` (the caller gave `stall_ms`);
    /// `fail_after` counts again from 0.
    pub fn set(&self, p: FaultParams, now: u64, restart_window: bool) {
        let mut cur = self.lock();
        let until = if p.stall {
            HELD
        } else if restart_window {
            match p.stall_ms {
                0 => 0,
                ms => now.saturating_add(ms.saturating_mul(1_000_000)),
            }
        } else {
            match self.stall_until.load(Ordering::Relaxed) {
                HELD => 0,
                t => t,
            }
        };
        self.stall_until.store(until, Ordering::Relaxed);
        if p.fail_after != cur.fail_after || restart_window {
            self.ios.store(0, Ordering::Relaxed);
        }
        *cur = p;
    }

    /// A uniform draw from [0, 1).
    fn draw(&self) -> f64 {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The error IO `op` of `len` bytes at leaf offset `abs` fails with, if it does.
    pub(crate) fn fail(&self, op: IoOp, abs: u64, len: u32) -> Option<u32> {
        let p = self.lock();
        if !p.hits(op) {
            return None;
        }
        let n = self.ios.fetch_add(1, Ordering::Relaxed);
        let offset = abs.wrapping_sub(self.origin);
        let fails = p.fail_after.is_some_and(|k| n >= k)
            || p.fail_range.is_some_and(|r| r.touches(offset, len))
            || (p.error_rate > 0.0 && self.draw() < p.error_rate);
        if !fails {
            return None;
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        Some(p.errno.value())
    }

    /// Latency added to IO `op`: the fixed part and, at the spike rate, a spike.
    pub(crate) fn latency_ns(&self, op: IoOp) -> u64 {
        let p = self.lock();
        if !p.hits(op) {
            return 0;
        }
        let mut us = p.latency_us;
        if p.spike_rate > 0.0 && self.draw() < p.spike_rate {
            us += p.spike_us;
        }
        (us * 1000.0) as u64
    }

    /// When a stall lets IO `op` completing at `now` go, if one holds it:
    /// a held stall answers a recheck time, as it has no end yet.
    pub(crate) fn stall_end(&self, op: IoOp, now: u64) -> Option<u64> {
        let until = self.stall_until.load(Ordering::Relaxed);
        if until <= now || !self.lock().hits(op) {
            return None;
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        Some(self.recheck(until, now))
    }

    /// For an IO already held: when to let it go or look again, if a stall still holds.
    pub(crate) fn still_stalled(&self, now: u64) -> Option<u64> {
        match self.stall_until.load(Ordering::Relaxed) {
            t if t <= now => None,
            t => Some(self.recheck(t, now)),
        }
    }

    fn recheck(&self, until: u64, now: u64) -> u64 {
        match until {
            HELD => now + STALL_RECHECK_NS,
            t => t,
        }
    }

    pub fn status(&self, now: u64) -> FaultStatus {
        let stall = match self.stall_until.load(Ordering::Relaxed) {
            HELD => "held".to_string(),
            t if t > now => format!("{}", (t - now).div_ceil(1_000_000)),
            _ => "no".to_string(),
        };
        FaultStatus {
            bdev: self.name.clone(),
            params: self.params(),
            ios: self.ios.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            held: self.held.load(Ordering::Relaxed),
            stall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(p: FaultParams) -> Fault {
        p.check().expect("valid");
        Fault::new("f", 4096, p)
    }

    const R: IoOp = IoOp::Read;
    const W: IoOp = IoOp::Write { fua: false };

    #[test]
    fn only_chosen_ops_fail_with_the_chosen_errno() {
        let f = fault(FaultParams {
            ops: vec![FaultOp::Read],
            errno: Errno::Enospc,
            error_rate: 1.0,
            ..FaultParams::default()
        });
        assert_eq!(f.fail(R, 4096, 512), Some(proto::ENOSPC));
        assert_eq!(f.fail(W, 4096, 512), None);
        assert_eq!(f.fail(IoOp::Flush, 0, 0), None);
        assert_eq!(f.status(0).errors, 1);
    }

    #[test]
    fn error_rate_is_a_share() {
        let f = fault(FaultParams {
            error_rate: 0.25,
            ..FaultParams::default()
        });
        let n = 100_000;
        let failed = (0..n).filter(|_| f.fail(R, 4096, 512).is_some()).count();
        assert!((23_000..27_000).contains(&failed), "{failed}");
    }

    #[test]
    fn a_range_fails_what_touches_it_in_the_fault_bdevs_own_offsets() {
        let range = FailRange {
            offset: ByteSize(8192),
            length: ByteSize(4096),
        };
        let f = fault(FaultParams {
            fail_range: Some(range),
            ..FaultParams::default()
        });
        // origin 4096: fault offset x is leaf offset x + 4096.
        assert_eq!(f.fail(R, 4096 + 4096, 4096), None, "ends where it starts");
        assert_eq!(f.fail(R, 4096 + 4097, 4096), Some(proto::EIO));
        assert_eq!(f.fail(W, 4096 + 12287, 1), Some(proto::EIO));
        assert_eq!(f.fail(R, 4096 + 12288, 4096), None, "starts where it ends");
        assert_eq!(f.fail(IoOp::Flush, 0, 0), None, "touches no bytes");
    }

    #[test]
    fn fail_after_counts_from_when_it_is_set() {
        let p = FaultParams {
            fail_after: Some(3),
            ..FaultParams::default()
        };
        let f = fault(p.clone());
        let got: Vec<bool> = (0..5).map(|_| f.fail(R, 0, 1).is_some()).collect();
        assert_eq!(got, [false, false, false, true, true]);
        f.set(p, 0, false);
        assert!(f.fail(R, 0, 1).is_some(), "unchanged: still failing");
        f.set(
            FaultParams {
                fail_after: Some(1),
                ..FaultParams::default()
            },
            0,
            false,
        );
        assert_eq!(f.fail(R, 0, 1), None);
        assert!(f.fail(R, 0, 1).is_some());
    }

    #[test]
    fn latency_is_fixed_plus_spikes_at_their_rate() {
        let f = fault(FaultParams {
            latency_us: 100.0,
            spike_us: 5000.0,
            spike_rate: 0.1,
            ops: vec![FaultOp::Read],
            ..FaultParams::default()
        });
        assert_eq!(f.latency_ns(W), 0);
        let n = 10_000;
        let lat: Vec<u64> = (0..n).map(|_| f.latency_ns(R)).collect();
        let spikes = lat.iter().filter(|&&l| l == 5_100_000).count();
        assert!(lat.iter().all(|&l| l == 100_000 || l == 5_100_000));
        assert!((800..1200).contains(&spikes), "{spikes}");
    }

    #[test]
    fn stalls_hold_until_released_or_their_time() {
        let f = fault(FaultParams::default());
        assert_eq!(f.stall_end(R, 5), None);
        let held = FaultParams {
            stall: true,
            ..FaultParams::default()
        };
        f.set(held.clone(), 1000, false);
        assert_eq!(f.stall_end(R, 2000), Some(2000 + STALL_RECHECK_NS));
        assert_eq!(f.still_stalled(3000), Some(3000 + STALL_RECHECK_NS));
        assert_eq!(f.status(3000).stall, "held");
        f.set(FaultParams::default(), 4000, false);
        assert_eq!(f.still_stalled(5000), None, "released");
        let timed = FaultParams {
            stall_ms: 2,
            ..FaultParams::default()
        };
        f.set(timed.clone(), 1_000_000, true);
        assert_eq!(f.stall_end(W, 1_500_000), Some(3_000_000));
        f.set(timed, 2_000_000, false);
        assert_eq!(f.still_stalled(2_500_000), Some(3_000_000), "not restarted");
        assert_eq!(f.still_stalled(3_000_000), None);
        assert_eq!(f.status(0).held, 2);
    }

    #[test]
    fn bad_values_name_their_field() {
        let bad = [
            (
                "error_rate",
                FaultParams {
                    error_rate: 1.5,
                    ..Default::default()
                },
            ),
            (
                "spike_rate",
                FaultParams {
                    spike_rate: -0.1,
                    ..Default::default()
                },
            ),
            (
                "latency_us",
                FaultParams {
                    latency_us: f64::NAN,
                    ..Default::default()
                },
            ),
            (
                "spike_us",
                FaultParams {
                    spike_us: 1e9,
                    ..Default::default()
                },
            ),
            (
                "stall_ms",
                FaultParams {
                    stall_ms: u64::MAX,
                    ..Default::default()
                },
            ),
            (
                "ops",
                FaultParams {
                    ops: vec![],
                    ..Default::default()
                },
            ),
            (
                "fail_range",
                FaultParams {
                    fail_range: Some(FailRange {
                        offset: ByteSize(u64::MAX),
                        length: ByteSize(2),
                    }),
                    ..Default::default()
                },
            ),
        ];
        for (field, p) in bad {
            assert_eq!(p.check().map_err(|e| e.0), Err(field));
        }
    }
}
