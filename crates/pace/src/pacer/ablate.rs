//! Switches that take one of `auto`'s mechanisms out, so the fuzzer can
//! measure what each one wins (`iopace sim --fuzz SEED --ablate NAME`; see
//! `docs/pacer.md`, "What each mechanism wins"). They are set once per
//! process, before any pacer runs; the target never sets them, so there
//! every mechanism is in.

use std::sync::OnceLock;

/// A mechanism that can be taken out (its number in `docs/pacer.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// 20: the learned depth; every window keeps factor 1.
    Depth,
    /// 19: the device gate beside light tenants.
    Gate,
    /// 21: the latency probe's periodic drain of the window.
    LatencyProbe,
    /// 26: the drain probe of a deep device's latency alone.
    DrainProbe,
    /// 23: stall detection; a stalled flow keeps counting.
    Stall,
    /// 25: the port load and pools; every port counts as shared.
    Ports,
    /// 18: the light (QD 1) tenant's way past the windows.
    Light,
    /// 10: the link share by hold ratio; every device counts as fast.
    HoldRatio,
    /// 12: device-queue detection; no device counts as keeping a queue.
    DeviceQueue,
    /// 27: each device's rate split between the reactors by their
    /// waiting flows; each reactor sizes on its own rate.
    DeviceShare,
    /// 14's order: flows at a device take equal device time; without it
    /// the oldest IO of the open flows goes.
    FlowFair,
    /// 28: device-bound flows' weighted parts of their device's window.
    FairPart,
    /// 29: a tenant held by a device's full window keeps its gap.
    DeviceWaiter,
    /// 16: tenants ahead of one waiting for the shared window go on.
    LinkWaiter,
    /// 17: a tenant ahead of one busy only on other reactors goes on.
    HoldPeers,
    /// 30: no IO goes past the tenants' order uncharged.
    Uncontended,
    /// 31: tenants' parts of a device they share; the window alone
    /// bounds them.
    TenantPart,
}

impl Mechanism {
    const ALL: [(Mechanism, &'static str); 17] = [
        (Mechanism::Depth, "depth"),
        (Mechanism::Gate, "gate"),
        (Mechanism::LatencyProbe, "latency-probe"),
        (Mechanism::DrainProbe, "drain-probe"),
        (Mechanism::Stall, "stall"),
        (Mechanism::Ports, "ports"),
        (Mechanism::Light, "light"),
        (Mechanism::HoldRatio, "hold-ratio"),
        (Mechanism::DeviceQueue, "device-queue"),
        (Mechanism::DeviceShare, "device-share"),
        (Mechanism::FlowFair, "flow-fair"),
        (Mechanism::FairPart, "fair-part"),
        (Mechanism::DeviceWaiter, "device-waiter"),
        (Mechanism::LinkWaiter, "link-waiter"),
        (Mechanism::HoldPeers, "hold-peers"),
        (Mechanism::Uncontended, "uncontended"),
        (Mechanism::TenantPart, "tenant-part"),
    ];

    /// Its bit in the set taken out.
    fn bit(self) -> u32 {
        1 << self as u32
    }
}

impl std::str::FromStr for Mechanism {
    type Err = String;

    fn from_str(s: &str) -> Result<Mechanism, String> {
        Mechanism::ALL
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(m, _)| *m)
            .ok_or_else(|| {
                let names: Vec<&str> = Mechanism::ALL.iter().map(|(_, n)| *n).collect();
                format!("no mechanism `{s}`; one of: {}", names.join(", "))
            })
    }
}

/// The mechanisms taken out, one bit each: one load and a mask on the
/// paths that ask per IO.
static OFF: OnceLock<u32> = OnceLock::new();

/// Takes `mechanisms` out for the rest of the process. False if a set was
/// already taken out (it stays as it was).
pub fn take_out(mechanisms: &[Mechanism]) -> bool {
    let bits = mechanisms.iter().fold(0, |bits, m| bits | m.bit());
    OFF.set(bits).is_ok()
}

/// The names of the mechanisms taken out, for a repro line.
pub fn taken_out() -> Vec<&'static str> {
    Mechanism::ALL
        .iter()
        .filter(|(m, _)| out(*m))
        .map(|(_, name)| *name)
        .collect()
}

/// `m` was taken out.
pub(super) fn out(m: Mechanism) -> bool {
    OFF.get().is_some_and(|off| off & m.bit() != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_list_the_known() {
        assert_eq!("latency-probe".parse(), Ok(Mechanism::LatencyProbe));
        let err = "depht".parse::<Mechanism>().unwrap_err();
        assert!(
            err.contains("depth") && err.contains("device-queue"),
            "{err}"
        );
        let bits = Mechanism::ALL.iter().fold(0u32, |bits, (m, _)| {
            assert_eq!(bits & m.bit(), 0, "{m:?} shares a bit");
            bits | m.bit()
        });
        assert_eq!(bits.count_ones() as usize, Mechanism::ALL.len());
    }
}
