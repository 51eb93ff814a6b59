//! Sans-IO pacing core: the pacer modes and the request lifecycle stats.
//! Time is injected as [`Nanos`] so the target and the simulator run the same code.

pub use types::Nanos;

pub mod pacer;
/// The buffer pool is its own crate (`crates/pool`); this name stays for
/// the engine's imports until they name `pool` directly.
pub use pool;
pub mod stats;
