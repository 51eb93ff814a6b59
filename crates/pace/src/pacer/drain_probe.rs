//! A device's latency alone. A device that serves its queue in order (or
//! one much deeper than its channels) holds every IO it is sent for the
//! whole queue, so each latency the pacer sees is queued and every window
//! sized on it admits the whole queue again: the device, not the pacer,
//! then orders the IO, and tenant weights do nothing. Once a second the
//! device's IO drains from the pipeline (new IO waits in the pacer, which
//! is where it would have waited at the device), and one IO goes alone:
//! its time at the device is the device's unloaded latency until the next
//! probe.

use crate::Nanos;

/// How often each busy device is drained to take its latency alone. Each
/// probe costs a slow parallel device about 1.5 of its latencies' worth of
/// throughput, so once a second keeps that under 1% at 5 ms.
const PROBE_EVERY_NS: Nanos = 1_000_000_000;

/// A drain or a lone IO that keeps IO in the pacer longer than a tenth of
/// the period (100 ms, the longest a DRR turn may wait) gives up: a queue
/// that deep is left to the device.
const PROBE_MAX_NS: Nanos = PROBE_EVERY_NS / 10;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Stage {
    #[default]
    Idle,
    /// No new IO goes to the device until what it holds has landed.
    Draining { since: Nanos },
    /// One IO was sent to the empty device; no other goes until it lands.
    Alone { since: Nanos },
}

#[derive(Debug, Default, Clone)]
pub(super) struct DrainProbe {
    stage: Stage,
    /// The probe period (`now / PROBE_EVERY_NS`) last probed in.
    period: Option<u64>,
    /// The device's latency alone, the IO's bytes, and when it was taken.
    alone: Option<(Nanos, u64, Nanos)>,
}

impl DrainProbe {
    /// Whether a probe may start at `now`: the first poll of a new period,
    /// with none running. Cheap, so a poll asks whether the device is deep
    /// (a cost-model sum) only then.
    pub fn due(&self, now: Nanos) -> bool {
        self.stage == Stage::Idle && self.period != Some(now / PROBE_EVERY_NS)
    }

    /// Starts a probe on a `deep` device if one is `due`; all reactors'
    /// periods align on the clock, so they drain together. Ends a probe
    /// that has run too long.
    pub fn tick(&mut self, deep: bool, now: Nanos) {
        let period = now / PROBE_EVERY_NS;
        if self
            .alone
            .is_some_and(|(_, _, at)| now - at > 2 * PROBE_EVERY_NS)
        {
            self.alone = None;
        }
        match self.stage {
            Stage::Idle if self.period != Some(period) && deep => {
                self.period = Some(period);
                self.stage = Stage::Draining { since: now };
            }
            Stage::Draining { since } | Stage::Alone { since } if now - since > PROBE_MAX_NS => {
                self.stage = Stage::Idle;
            }
            _ => {}
        }
    }

    /// Whether the probe decides this release: `Some(open)` while probing,
    /// `None` when the device's window decides.
    pub fn admits(&self, in_flight_ios: u32) -> Option<bool> {
        match self.stage {
            Stage::Idle => None,
            Stage::Draining { .. } => Some(in_flight_ios == 0),
            Stage::Alone { .. } => Some(false),
        }
    }

    /// An IO was released to the device.
    pub fn released(&mut self, now: Nanos) {
        if let Stage::Draining { .. } = self.stage {
            self.stage = Stage::Alone { since: now };
        }
    }

    /// An IO of `bytes` spent `at_device` at the device, which now holds
    /// `in_flight_ios`: the lone IO's time is the device's latency alone.
    pub fn landed(&mut self, at_device: Nanos, bytes: u64, in_flight_ios: u32, now: Nanos) {
        if let (Stage::Alone { .. }, 0) = (self.stage, in_flight_ios) {
            self.alone = Some((at_device.max(1), bytes, now));
            self.stage = Stage::Idle;
        }
    }

    /// The device's latency alone, from a probe in the last two periods,
    /// if the lone IO was one of the `largest` it is sent: a smaller one's
    /// time would size the windows of the largest too small.
    pub fn latency_alone(&self, largest: u64) -> Option<Nanos> {
        let (latency, bytes, _) = self.alone?;
        (bytes >= largest).then_some(latency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_device_drains_then_sends_one_io_alone() {
        let mut p = DrainProbe::default();
        p.tick(false, 0);
        assert_eq!(p.admits(1), None, "one IO at the device: nothing to drain");
        p.tick(true, 10);
        assert_eq!(p.admits(8), Some(false), "draining");
        assert_eq!(p.admits(0), Some(true), "drained: one may go");
        p.released(500);
        assert_eq!(p.admits(1), Some(false), "the lone IO is out");
        p.landed(300, 4096, 0, 800);
        assert_eq!(p.admits(5), None, "done");
        assert_eq!(p.latency_alone(4096), Some(300));
        assert_eq!(p.latency_alone(8192), None, "a smaller IO's time");
        p.tick(true, 1_000);
        assert_eq!(p.admits(8), None, "one probe a period");
        p.tick(true, PROBE_EVERY_NS);
        assert_eq!(p.admits(8), Some(false), "the next period probes again");
        p.tick(false, 3 * PROBE_EVERY_NS);
        assert_eq!(p.latency_alone(0), None, "too old");
    }

    #[test]
    fn a_drain_that_takes_too_long_gives_up() {
        let mut p = DrainProbe::default();
        p.tick(true, 0);
        p.tick(true, PROBE_MAX_NS + 1);
        assert_eq!(p.admits(64), None);
        assert_eq!(p.latency_alone(0), None);
    }
}
