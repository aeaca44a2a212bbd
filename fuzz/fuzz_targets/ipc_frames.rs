//! Arbitrary bytes as IPC frames and payloads of every message type.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mlxcel_ipc::fuzzing::payloads(data);
    mlxcel_ipc::fuzzing::frames(data);
});
