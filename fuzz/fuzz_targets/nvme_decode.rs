#![no_main]
//! Fuzzes the NVMe/TCP PDU decoder (both roles, any digests) and re-encoding.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = proto::nvme::fuzzing::run(data);
});
