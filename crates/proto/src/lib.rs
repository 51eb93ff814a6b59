//! NBD wire protocol: sans-IO handshake and transmission codecs.
//! Knows nothing of sockets or threads; the target and the fuzzer drive it with bytes.
