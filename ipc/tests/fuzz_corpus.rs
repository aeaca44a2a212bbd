//! Replays the fuzz corpus (`fuzz/corpus/ipc_frames`, grown by `make fuzz`) through the same
//! entry points the fuzzer drives, on stable Rust: every input that once mattered to coverage
//! (and every crash, once fixed and added) keeps being decoded without a panic.

use std::path::PathBuf;

#[test]
fn every_corpus_input_decodes_without_panicking() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/ipc_frames");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the fuzz corpus") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        mlxcel_ipc::fuzzing::payloads(&data);
        mlxcel_ipc::fuzzing::frames(&data);
        n += 1;
    }
    assert!(n >= 100, "only {n} inputs in {}", dir.display());
}
