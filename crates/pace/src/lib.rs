//! Sans-IO pacing core: buffer pool, request lifecycle stats, pacer modes.
//! Time is injected as [`Nanos`] so the target and the simulator run the same code.

/// Monotonic time in nanoseconds from an arbitrary origin, supplied by the driver.
pub type Nanos = u64;

pub mod pacer;
pub mod pool;
pub mod stats;
