#!/usr/bin/env python3
"""Copy the published mlx-sys crate into build/ and adapt it to Linux + MLX's CPU wheel.

Only our own edits live in this repository; the crate's source comes from the cargo
registry at setup time. Every edit names the exact text it replaces and fails loudly if
that text is not there, so a new mlx-sys release cannot be half-patched silently.

Usage: patch_mlx_sys.py REGISTRY_CRATE_DIR OUT_DIR
"""

import shutil
import sys
from pathlib import Path

# The stamp is this script's own hash: editing the patch re-applies it on the next setup.
STAMP = "mlxcel-linux-patch " + __import__("hashlib").sha256(Path(__file__).read_bytes()).hexdigest()


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    count = text.count(old)
    if count != 1:
        sys.exit(f"patch_mlx_sys: expected exactly one match in {path}, found {count}:\n{old}")
    path.write_text(text.replace(old, new))


# mlx-c's half.h only defines the f16/bf16 types on ARM. On x86 the C++ side uses MLX's own
# 16-bit types (same layout as a u16) and bindgen sees __fp16 / uint16_t, which map to the
# Rust types mlx-rs expects (__BindgenFloat16 and u16).
HALF_H = """/* mlx-c half.h, rewritten by mlxcel's scripts/patch_mlx_sys.py for non-ARM targets. */
#ifndef MLX_HALF_H
#define MLX_HALF_H

#if defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC) || defined(__aarch64__)
#define HAS_FLOAT16
#include <arm_fp16.h>
typedef __fp16 float16_t;
#endif

#if defined(__ARM_FEATURE_BF16) || defined(__aarch64__)
#define HAS_BFLOAT16
#include <arm_bf16.h>
typedef __bf16 bfloat16_t;
#endif

#if !defined(HAS_FLOAT16)
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
#include <stdint.h>
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
#endif
#endif

#endif
"""

# g++ 12 has no std::format; the messages it builds are plain concatenations.
IO_H_EDITS = [
    ('std::format("unable to read {} bytes (read {} instead)", n, read_n)',
     '"unable to read " + std::to_string(n) + " bytes (read " + std::to_string(read_n) + " instead)"'),
    ('std::format("[mlx_io_reader] {} in {}", msg, label())',
     '"[mlx_io_reader] " + msg + " in " + label()'),
    ('std::format(\n              "unable to write {} bytes (wrote {} instead)", n, wrote_n)',
     '"unable to write " + std::to_string(n) + " bytes (wrote " + std::to_string(wrote_n) + " instead)"'),
    ('std::format("[mlx_io_writer] {} in {}", msg, label())',
     '"[mlx_io_writer] " + msg + " in " + label()'),
]

# MLX 0.32.3 added `global_scale` to gather_qmm, before `sorted_indices`.
OPS_OLD = """            std::string(mode),
            sorted_indices,
            mlx_stream_get_(s)));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
extern "C" int mlx_gather_qqmm("""
OPS_NEW = """            std::string(mode),
            std::nullopt,
            sorted_indices,
            mlx_stream_get_(s)));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
extern "C" int mlx_gather_qqmm("""

BUILD_RS_OLD = "fn build_and_link_mlx_c() {\n"
BUILD_RS_NEW = """fn build_and_link_mlx_c() {
    if cross_check() {
        return;
    }
    if env::var("CARGO_CFG_TARGET_VENDOR").as_deref() != Ok("apple") {
        return build_and_link_system_mlx();
    }
"""

# The bindings of a macOS type check from Linux (`scripts/check_macos.sh`): generated for the
# host, whose headers clang finds (the declarations are the same on both; only the check links
# nothing).
BINDINGS_OLD = """    let bindings = bindgen_config::builder(&mlx_c_root, &headers)
"""
BINDINGS_NEW = """    let host_target = format!("--target={}", env::var("HOST").unwrap_or_default());
    let bindings = bindgen_config::builder(&mlx_c_root, &headers)
        .clang_args(cross_check().then_some(host_target))
"""

# Appended to build.rs: non-Apple targets build mlx-c against the MLX of the mlx-cpu wheel.
BUILD_RS_SYSTEM = r'''

/// A type check for macOS from another host (added by mlxcel's scripts/patch_mlx_sys.py):
/// MLX cannot be built here for Apple's targets, and a check links nothing, so nothing is built
/// and the bindings are generated for the host.
fn cross_check() -> bool {
    env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple")
        && !env::var("HOST").unwrap_or_default().contains("apple")
}

/// Non-Apple targets (added by mlxcel's scripts/patch_mlx_sys.py): build mlx-c against the
/// prebuilt MLX at `$MLX_DIR` (the `share/cmake/MLX` folder of the `mlx-cpu` wheel) and link
/// its `libmlx.so` dynamically. Dependents get its library folder as `DEP_MLX_LIBDIR`.
fn build_and_link_system_mlx() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    let mlx_dir = PathBuf::from(
        env::var("MLX_DIR").expect("set MLX_DIR to <mlx-cpu wheel>/mlx/share/cmake/MLX (run make setup)"),
    );
    let prefix = mlx_dir.join("../../..").canonicalize().expect("MLX_DIR must exist");
    let lib_dir = prefix.join("lib");
    let mut config = Config::new("src/mlx-c");
    config
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_DIR", &mlx_dir)
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("CMAKE_INSTALL_PREFIX", ".")
        .define("CMAKE_BUILD_TYPE", "Release")
        .cxxflag(format!("-I{}", prefix.join("include").display()));
    let dst = config.build();
    for sub in ["lib", "lib64", "build"] {
        println!("cargo:rustc-link-search=native={}", dst.join(sub).display());
    }
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo::metadata=libdir={}", lib_dir.display());
    println!(
        "cargo::metadata=include={}",
        env::join_paths([prefix.join("include"), PathBuf::from("src/mlx-c")]).unwrap().display()
    );
    // mlx-rs seeds its RNG with macOS's mach_approximate_time; give Linux a monotonic clock.
    cc::Build::new().file("src/mach_time_linux.c").compile("mlxcel_mach_time");
}
'''

MACH_TIME_C = """/* Linux stand-in for macOS's mach_approximate_time (added by mlxcel). */
#include <stdint.h>
#include <time.h>

uint64_t mach_approximate_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
"""


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    if (out / ".mlxcel-patch").exists() and (out / ".mlxcel-patch").read_text() == STAMP:
        print(f"mlx-sys already patched in {out}")
        return
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    mlx_c = out / "src" / "mlx-c" / "mlx" / "c"
    (mlx_c / "half.h").write_text(HALF_H)
    for old, new in IO_H_EDITS:
        text = (mlx_c / "private" / "io.h").read_text()
        if text.count(old) < 1:
            sys.exit(f"patch_mlx_sys: io.h no longer contains {old!r}")
        (mlx_c / "private" / "io.h").write_text(text.replace(old, new))
    replace_once(mlx_c / "ops.cpp", OPS_OLD, OPS_NEW)
    replace_once(out / "build.rs", BUILD_RS_OLD, BUILD_RS_NEW)
    replace_once(out / "build.rs", BINDINGS_OLD, BINDINGS_NEW)
    with open(out / "build.rs", "a") as f:
        f.write(BUILD_RS_SYSTEM)
    (out / "src" / "mach_time_linux.c").write_text(MACH_TIME_C)
    (out / ".mlxcel-patch").write_text(STAMP)
    print(f"patched mlx-sys into {out}")


if __name__ == "__main__":
    main()
