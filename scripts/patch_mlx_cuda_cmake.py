#!/usr/bin/env python3
"""Let mlx-c build against MLX's CUDA wheel on a machine without the CUDA toolkit.

The wheel's MLXConfig.cmake asks CMake for the CUDA toolkit (nvcc) and cuDNN, though building
mlx-c needs only MLX's headers and libmlx.so; the CUDA libraries are loaded at run time on the
GPU machine. This replaces those lookups with an empty `CUDA::cuda_driver` target (the one name
the exported target refers to). Idempotent; fails loudly if the text it edits is not there.

Usage: patch_mlx_cuda_cmake.py PATH/TO/MLXConfig.cmake
"""

import sys
from pathlib import Path

OLD = """    find_dependency(CUDAToolkit REQUIRED)

    set(_MLX_SAVED_CMAKE_MODULE_PATH "${CMAKE_MODULE_PATH}")
    list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
    find_dependency(CUDNN REQUIRED)
    set(CMAKE_MODULE_PATH "${_MLX_SAVED_CMAKE_MODULE_PATH}")
    unset(_MLX_SAVED_CMAKE_MODULE_PATH)"""

NEW = """    # mlxcel: mlx-c needs only MLX's headers and libmlx.so; the CUDA libraries are found at run
    # time on the GPU machine, so no CUDA toolkit is needed to build.
    if(NOT TARGET CUDA::cuda_driver)
        add_library(CUDA::cuda_driver INTERFACE IMPORTED)
    endif()"""


def main() -> None:
    path = Path(sys.argv[1])
    text = path.read_text()
    if NEW in text:
        return
    if text.count(OLD) != 1:
        sys.exit(f"patch_mlx_cuda_cmake: the CUDA lookup to replace is not in {path}")
    path.write_text(text.replace(OLD, NEW))


if __name__ == "__main__":
    main()
