#!/usr/bin/env bash
# Compiles every custom CUDA kernel of the engine, in every variant a decode step applies, as MLX's
# CUDA back end would on an H100 or H200, on this machine, without a GPU: so a kernel that would
# not compile there (a typo, a bad inline PTX instruction) fails here, in `make test`, before it
# stops a CUDA daemon's warm-up.
#
#   1. MLX's CUDA wheel (the version setup.sh pins for MLXCEL_BACKEND=cuda): its headers and
#      libmlx.so, which holds MLX's device headers; NVRTC and the CUDA runtime's headers from
#      PyPI (pinned). All under build/kernel-check, fetched once.
#   2. tests/kernel_sources.rs with MLXCEL_KERNEL_SOURCES: each kernel's source as MLX writes it
#      (the daemon built with its `cuda` feature: the CUDA backend on this machine's MLX).
#   3. scripts/cuda_kernel_check.py: NVRTC on each, to SASS for ARCHS (default sm_90a).
# Linux x86-64 only (the wheels are); elsewhere it says so and passes.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$ROOT/build/kernel-check"
NVRTC_VERSION="13.5.37"
ARCHS="${ARCHS:-sm_90a}"
say() { printf '[kernel-check] %s\n' "$*" >&2; }

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  say "skipped: the CUDA wheels are Linux x86-64 only, this is $(uname -s)-$(uname -m)"
  exit 0
fi
python="$ROOT/.venv/bin/python"
[ -x "$python" ] || python=python3
mlx_version="$(sed -n 's/^MLX_CUDA_VERSION="\(.*\)"$/\1/p' "$ROOT/scripts/setup.sh")"
[ -n "$mlx_version" ] || { say "no MLX_CUDA_VERSION in scripts/setup.sh"; exit 1; }

if [ ! -f "$DIR/mlx-$mlx_version/mlx/lib/libmlx.so" ]; then
  say "fetching mlx-cuda-13==$mlx_version (its headers and libmlx.so; ~90 MB)"
  rm -rf "$DIR/wheel" "$DIR/mlx-$mlx_version"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 -d "$DIR/wheel" "mlx-cuda-13==$mlx_version"
  mkdir -p "$DIR/mlx-$mlx_version.tmp"
  "$python" -m zipfile -e "$DIR"/wheel/mlx_cuda_13-*.whl "$DIR/mlx-$mlx_version.tmp"
  mkdir -p "$DIR/mlx-$mlx_version/mlx/lib"
  mv "$DIR/mlx-$mlx_version.tmp/mlx/include" "$DIR/mlx-$mlx_version/mlx/"
  mv "$DIR/mlx-$mlx_version.tmp/mlx/lib/libmlx.so" "$DIR/mlx-$mlx_version/mlx/lib/"
  rm -rf "$DIR/mlx-$mlx_version.tmp" "$DIR/wheel"
fi
if [ ! -f "$DIR/nvidia-$NVRTC_VERSION/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  say "fetching NVRTC and the CUDA runtime's headers $NVRTC_VERSION (~80 MB)"
  rm -rf "$DIR/nvidia-$NVRTC_VERSION"
  "$python" -m pip install -q --no-deps --target "$DIR/nvidia-$NVRTC_VERSION" \
    "nvidia-cuda-nvrtc==$NVRTC_VERSION" "nvidia-cuda-runtime==$NVRTC_VERSION"
fi

sources="$DIR/sources"
rm -rf "$sources"
say "writing each kernel's source (tests/kernel_sources.rs)"
MLXCEL_KERNEL_SOURCES="$sources" "${CARGO:-cargo}" test -q -p mlxcel-daemon --features cuda \
  --test kernel_sources
# shellcheck disable=SC2086
python3 "$ROOT/scripts/cuda_kernel_check.py" "$sources" "$DIR/mlx-$mlx_version/mlx" \
  "$DIR/nvidia-$NVRTC_VERSION/nvidia" $ARCHS
