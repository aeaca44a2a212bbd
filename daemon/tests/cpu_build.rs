//! A daemon built for the CPU (or Metal) contains no CUDA backend: none of its kernels' names,
//! none of its module's symbols. Checked on the executable itself.

#[test]
fn a_daemon_built_without_cuda_contains_none_of_its_backend() {
    if cfg!(mlxcel_cuda) {
        eprintln!(
            "skipped: this build compiles the CUDA backend (a CUDA build or --features cuda)"
        );
        return;
    }
    let exe = std::fs::read(env!("CARGO_BIN_EXE_mlxcel-daemon")).expect("the daemon's executable");
    let contains = |needle: &str| exe.windows(needle.len()).any(|w| w == needle.as_bytes());
    // The CPU backend is there (its module's symbols), so the search can find what is there.
    assert!(
        contains("backend3cpu"),
        "the search finds the CPU backend's symbols"
    );
    for absent in [
        "backend4cuda",
        "mlxcel_few_rows",
        "mlxcel_table_attention",
        "mlxcel_decode_attention",
        "nvrtcGetCUBIN",
    ] {
        assert!(
            !contains(absent),
            "{absent} is in a daemon built without CUDA"
        );
    }
}
