//! Sans-IO pacing core: the pacer modes and the request lifecycle stats.
//! Time is injected as [`Nanos`] so the target and the simulator run the same code.

pub use types::Nanos;

pub mod pacer;
pub mod stats;
