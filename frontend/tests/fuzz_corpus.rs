//! Replays the fuzz corpus (`fuzz/corpus/http_bodies`, grown by `make fuzz`) through the same
//! entry points the fuzzer drives, on stable Rust.

use std::path::PathBuf;

#[test]
fn every_corpus_input_parses_or_is_refused_without_panicking() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/http_bodies");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the fuzz corpus") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        mlxcel_frontend::fuzzing::request_bodies(&data);
        mlxcel_frontend::fuzzing::stop_strings(&data);
        mlxcel_frontend::fuzzing::replies(&data);
        n += 1;
    }
    assert!(n >= 100, "only {n} inputs in {}", dir.display());
}
