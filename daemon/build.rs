//! Linux: the binaries must find the mlx-cpu wheel's libmlx.so without LD_LIBRARY_PATH (rpath),
//! and BLAS calls must resolve to OpenBLAS rather than the wheel's reference BLAS, which is
//! ~14x slower: linking libopenblas directly (and not as-needed) puts it ahead in symbol lookup.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if let (true, Ok(dir)) = (linux, std::env::var("DEP_MLX_LIBDIR")) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-lopenblas");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
