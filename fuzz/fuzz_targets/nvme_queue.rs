#![no_main]
//! Fuzzes the NVMe/TCP queue and controller state machines with byte streams.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    proto::nvme::fuzzing::run_queue(data);
});
