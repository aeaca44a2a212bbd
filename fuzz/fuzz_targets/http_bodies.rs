//! Arbitrary bytes as HTTP request bodies of every route, and as text for stop strings and the
//! reply parser.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    mlxcel_frontend::fuzzing::request_bodies(data);
    mlxcel_frontend::fuzzing::stop_strings(data);
    mlxcel_frontend::fuzzing::replies(data);
});
