//! What a window is sized from: the pacer's measures (`Sizing`) and the
//! least windows (`Floors`) that [`flows`](super::flows) sums hosts' and
//! flows' windows with.

use crate::Nanos;

/// The least windows `window_sum` gives.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Floors {
    /// Any active host's least window here.
    pub host: u64,
    /// What the active network hosts here hold at least, between them.
    pub shared: u64,
}

/// What the window formula needs from the pacer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    pub gain: f64,
    pub max_io: u64,
    pub max_window: u64,
    /// The reactor's min release-to-done latency, if measured.
    pub latency: Option<Nanos>,
    /// The completed IO's device's hold time (see `Windows::hold_time`).
    pub hold: Option<Nanos>,
    /// Its device's queued hold, if it keeps a queue of its own (see
    /// `Windows::queued_hold`): the flow's own window allows for that
    /// queue, its bandwidth-delay product (what its host's and the
    /// reactor's windows sum) does not.
    pub queued: Option<Nanos>,
}
