//! The iopace target: config, io_uring reactors, connections, admin RPC.

mod acceptor;
pub mod access;
pub mod bounds;
pub mod config;
pub mod cost_db;
pub mod engine;
pub mod exports;
pub mod fault_ctl;
mod gather;
mod metrics;
pub mod nvmf;
pub mod reactor;
mod reload;
mod ring;
pub mod rpc;
pub mod server;
mod sockets;
pub mod splice;
pub mod stats;
pub mod tls;
mod toml_locate;
pub mod trace_rpc;

pub use config::{Config, ConfigError, LoadedConfig};
pub use server::{serve, ServeError};
