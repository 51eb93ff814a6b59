//! The types every crate of iopace shares: time as the drivers supply it,
//! the kind of an IO, the device cost model that both the pacer and the
//! devices (bdev, simulator, probe) speak, and the states the statistics
//! count a request under.

use serde::Serialize;

mod cost;

pub use cost::CostModel;

/// Monotonic time in nanoseconds from an arbitrary origin, supplied by the driver.
pub type Nanos = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum IoKind {
    Read,
    Write,
}

/// The states the statistics count a request under: a coarse view of its
/// life (the engine's `ReqStage` maps each of its states to one of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum StatState {
    /// Header decoded, not yet handed to the pacer.
    New,
    /// Queued in the pacer.
    Pacing,
    /// Released by the pacer, waiting for data buffers.
    NeedBuffer,
    /// At the bdev.
    Executing,
    /// Data moving over the socket: WRITE payload in, or reply out.
    Transfer,
    /// Finished; its slot is free.
    Done,
}

impl StatState {
    pub const ALL: [StatState; 6] = [
        StatState::New,
        StatState::Pacing,
        StatState::NeedBuffer,
        StatState::Executing,
        StatState::Transfer,
        StatState::Done,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StatState::New => "NEW",
            StatState::Pacing => "PACING",
            StatState::NeedBuffer => "NEED_BUFFER",
            StatState::Executing => "EXECUTING",
            StatState::Transfer => "TRANSFER",
            StatState::Done => "DONE",
        }
    }

    /// Its place in [`StatState::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}
