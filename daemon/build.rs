//! Linux: the binaries must find the MLX wheel's libmlx.so without LD_LIBRARY_PATH (rpath).
//! - CPU (the default): BLAS calls must resolve to OpenBLAS rather than the wheel's reference
//!   BLAS, which is ~14x slower: linking libopenblas directly (and not as-needed) puts it ahead
//!   in symbol lookup.
//! - CUDA (`MLXCEL_BACKEND=cuda`, set by `make setup`): the CUDA backend is compiled
//!   (`backend::cuda`; elsewhere only with the `cuda` feature), no OpenBLAS (the GPU does the math), and
//!   libmlx.so's CUDA libraries are left to the loader of the GPU machine, so a machine without
//!   them can build. The daemon defines the NVRTC calls MLX compiles its kernels with (to keep
//!   our custom kernels' modules across starts: `src/kernel_modules.rs`), exported here.
/// The NVRTC calls `nvrtc_tap` (in `src/main.rs`) defines.
const TAPPED: [&str; 5] = [
    "nvrtcCreateProgram",
    "nvrtcGetLoweredName",
    "nvrtcGetCUBIN",
    "nvrtcGetPTX",
    "nvrtcDestroyProgram",
];

fn main() {
    // `mlxcel_cuda`: the CUDA backend is compiled (a CUDA build, or the `cuda` feature on any
    // build for the kernel-source check); `mlxcel_cuda_link`: the binaries link MLX's CUDA build.
    println!("cargo:rustc-check-cfg=cfg(mlxcel_cuda)");
    println!("cargo:rustc-check-cfg=cfg(mlxcel_cuda_link)");
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    println!("cargo:rerun-if-env-changed=MLXCEL_BACKEND");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    let cuda = std::env::var("MLXCEL_BACKEND").as_deref() == Ok("cuda");
    if cuda || std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-cfg=mlxcel_cuda");
    }
    if let (true, Ok(dir)) = (linux, std::env::var("DEP_MLX_LIBDIR")) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        if cuda {
            println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
            // main's `nvrtc_tap`: the daemon's NVRTC calls, exported so libmlx binds to them.
            println!("cargo:rustc-cfg=mlxcel_cuda_link");
            for f in TAPPED {
                println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol={f}");
            }
        } else {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-lopenblas");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
        }
    }
}
