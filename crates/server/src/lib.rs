//! The iopace target: io_uring reactors, connections, TLS, admin RPC, metrics.
//! Its configuration is the `config` crate.

mod acceptor;
pub mod dirty_ctl;
pub mod dirty_persist;
pub mod engine;
mod error;
pub mod exports;
pub mod fault_ctl;
mod gather;
mod metrics;
pub mod nvmf;
pub mod reactor;
mod reload;
mod ring;
pub mod rpc;
pub mod serve;
mod sockets;
pub mod splice;
pub mod stats;
pub mod tls;
pub mod trace_rpc;

/// The config crate, also under this crate's name for it: the engine's and
/// the NVMe/TCP driver's `config::..` paths stay as they were.
pub use config;
use config::access;
pub use config::{Config, ConfigError, LoadedConfig};
pub use error::ServeError;
pub use serve::serve;
