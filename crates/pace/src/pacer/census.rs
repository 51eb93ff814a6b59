//! A census of where queued IO waits, for `iopace sim --trace`: for each
//! tenant and each device it has IO queued at, which of `auto`'s windows
//! holds its next IO (`Pacer::census`, beside the gates it reads in
//! `admit.rs`). It changes nothing, so a trace shows what binds (the
//! flows' own windows, the reactor's shared window or the device's)
//! without a debugger.

/// Where one tenant's queued IO waits, counted over the devices it has IO
/// queued at (see `Pacer::census`).
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
