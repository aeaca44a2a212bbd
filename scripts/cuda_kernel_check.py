"""Compiles kernel sources (as `tests/kernel_sources.rs` writes them: the CUDA C MLX compiles)
with NVRTC the way MLX 0.32's CUDA back end does (`mlx/backend/cuda/jit_module.cpp`): MLX's
device headers given in memory, its bundled CCCL and the CUDA runtime's headers on the include
path, `--device-as-default-execution-space`, and SASS for each architecture asked for (so
PTXAS runs too, and inline PTX is checked). No GPU is needed.

MLX's device headers are not files in its wheel: they are strings inside libmlx.so. They are
found there by what each one declares.

Usage: cuda_kernel_check.py SOURCES_DIR MLX_DIR NVIDIA_DIR [ARCH...]
  MLX_DIR: the CUDA wheel's `mlx` package (include/, lib/libmlx.so); NVIDIA_DIR: the `nvidia`
  package holding cu13/lib/libnvrtc.so.13 and cu13/include; ARCH: e.g. sm_90a (the default:
  H100 and H200).
"""

import concurrent.futures
import ctypes
import os
import pathlib
import re
import sys

# MLX's device headers this check provides, each told by a line only it has.
HEADERS = {
    "utils.cuh": b"using Shape = cuda::std::array",
    "complex.cuh": b"using complex64_t = ",
    "config.h": b"MAX_NDIM",
}


def device_headers(libmlx):
    """{include name: source} of MLX's device headers embedded in libmlx.so."""
    data = libmlx.read_bytes()
    found = {}
    for m in re.finditer(rb"#pragma once", data):
        start = data.rfind(b"\0", 0, m.start()) + 1
        text = data[start : data.find(b"\0", m.start())]
        if b"Apple Inc." not in text[:200]:
            continue
        for name, mark in HEADERS.items():
            # config.h is the short one that defines MAX_NDIM; the others only use it.
            if mark in text and (name != "config.h" or len(text) < 1500):
                found.setdefault(name, text)
    missing = set(HEADERS) - set(found)
    if missing:
        sys.exit(f"MLX's device headers {sorted(missing)} not found in {libmlx}")
    return {f"mlx/backend/cuda/device/{n}": t for n, t in found.items()}


def compile_one(nvrtc, path, headers, options):
    """None if `path` compiles, else NVRTC's log."""
    prog = ctypes.c_void_p()
    names = list(headers)
    srcs = (ctypes.c_char_p * len(names))(*[headers[n] for n in names])
    incs = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
    rc = nvrtc.nvrtcCreateProgram(
        ctypes.byref(prog), path.read_bytes(), path.name.encode(), len(names), srcs, incs
    )
    if rc != 0:
        return f"nvrtcCreateProgram failed ({rc})"
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return None if rc == 0 else log.value.decode(errors="replace")


_worker = {}


def _start(libnvrtc, headers, options):
    _worker.update(nvrtc=ctypes.CDLL(libnvrtc), headers=headers, options=options)


def _compile(path):
    return compile_one(_worker["nvrtc"], path, _worker["headers"], _worker["options"])


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sources, mlx, nvidia = (pathlib.Path(a) for a in sys.argv[1:4])
    archs = sys.argv[4:] or ["sm_90a"]
    cu = nvidia / "cu13"
    libnvrtc = str(cu / "lib" / "libnvrtc.so.13")
    headers = device_headers(mlx / "lib" / "libmlx.so")
    include = [mlx / "include", mlx / "include" / "cccl", cu / "include"]
    files = sorted(sources.glob("*.cu"))
    if not files:
        sys.exit(f"no kernel sources under {sources}")
    failed = 0
    for arch in archs:
        options = ["--device-as-default-execution-space", f"--gpu-architecture={arch}"]
        options += [f"--include-path={p}" for p in include]
        workers = os.cpu_count() or 1
        start = (libnvrtc, headers, options)
        with concurrent.futures.ProcessPoolExecutor(workers, initializer=_start, initargs=start) as pool:
            logs = list(pool.map(_compile, files))
        for f, log in zip(files, logs):
            print(f"[kernel-check] {arch} {'ok  ' if log is None else 'FAIL'} {f.name}", flush=True)
            if log is not None:
                failed += 1
                print(log)
    print(f"[kernel-check] {len(files) * len(archs) - failed} compiled, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
