//! A census of where queued IO waits, for `iopace sim --trace`: for each
//! tenant and each device it has IO queued at, which of `auto`'s windows
//! holds its next IO. It reads the pacer and changes nothing, so a trace
//! shows what binds (the flows' own windows, the reactor's shared window
//! or the device's) without a debugger.

use super::{Mode, Pacer};

/// Where one tenant's queued IO waits, counted over the devices it has IO
/// queued at (see [`Pacer::census`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Every flow with IO here waits for its own window (flow, host,
    /// fair part or pool cap).
    pub flows: u32,
    /// A flow may go, but the reactor's shared window is full.
    pub reactor: u32,
    /// A flow may go and the shared window has room; the device's window
    /// (or a heavier waiter for it) holds the IO.
    pub device: u32,
    /// Nothing of these holds it: DRR debt, the tenant clock, a gate or
    /// budget, or it goes at the next poll.
    pub open: u32,
}

impl Pacer {
    /// Where each tenant's queued IO waits now (`auto` only; other modes
    /// have no windows, and every tenant counts as `open`).
    pub fn census(&self) -> Vec<Held> {
        let mut out = vec![Held::default(); self.sched.tenants.len()];
        for (d, dev) in self.sched.devices.iter().enumerate() {
            for (t, held) in out.iter_mut().enumerate() {
                if !dev.queue.has(t) {
                    continue;
                }
                if self.cfg.mode != Mode::Auto {
                    held.open += 1;
                    continue;
                }
                let Some(slot) = self.windows.head(&self.cfg, &self.sched, d, t) else {
                    held.flows += 1;
                    continue;
                };
                let io = dev.queue.io(slot);
                let bytes = u64::from(io.bytes);
                let paced = self
                    .windows
                    .link_share(&self.cfg, &self.sched.devices, d, bytes);
                let shared = self.windows.shared_window_open(
                    &self.cfg,
                    &self.sched.tenants,
                    t,
                    paced,
                    bytes,
                    self.bytes_in_flight,
                );
                match (shared, self.device_open(t, d, &io)) {
                    (false, _) => held.reactor += 1,
                    (true, false) => held.device += 1,
                    (true, true) => held.open += 1,
                }
            }
        }
        out
    }
}
