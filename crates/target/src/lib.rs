//! The iopace target: config, io_uring reactors, connections, admin RPC.
