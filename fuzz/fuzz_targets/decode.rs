#![no_main]
//! Fuzzes the handshake state machine and the request decoder/validator.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    proto::fuzzing::run(data);
});
