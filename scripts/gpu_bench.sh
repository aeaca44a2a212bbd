#!/usr/bin/env bash
# The GPU benchmark (bench/gpu_throughput.py) on a Linux machine with an NVIDIA GPU, its driver
# and the CUDA 13 libraries (e.g. pip's nvidia-* wheels), numpy, transformers and the rest of
# mlx-lm's needs, and no network: mlxcel built against MLX's CUDA wheel
# (`MLXCEL_BACKEND=cuda make setup`) side by side with mlx_lm.server on the same MLX, for each
# random-weight Llama named (bench/random_llama.py writes them, once, under MODELS).
#
# Usage: gpu_bench.sh STAGE OUT LIKE...      (LIKE: 1b, 8b or tiny)
#   STAGE holds wheels/ (mlx-cuda-13, mlx and mlx-lm at the versions setup pins, under their own
#   file names), bin/ (mlxcelctl, mlxcel-frontend, mlxcel-daemon, mlxcel-cachemgr from the CUDA
#   build) and tokenizer/ (SmolLM2's tokenizer.json, tokenizer_config.json and config.json, as
#   `mlxcel-daemon --export-mlx` writes them). MODELS defaults to /tmp/gpu-models.
set -uo pipefail

STAGE="$1"
OUT="$2"
shift 2
MODELS="${MODELS:-/tmp/gpu-models}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT" "$MODELS"

if [ ! -d "$STAGE/site/mlx" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$STAGE/site" "$STAGE"/wheels/*.whl || exit 1
fi
# The NVIDIA libraries wherever Python's packages are, then the driver's usual places.
nvidia="$(python3 -c 'import glob, sys; print(":".join(sorted({d for p in sys.path for d in glob.glob(p + "/nvidia/*/lib")})))')"
export LD_LIBRARY_PATH="$STAGE/site/mlx/lib:$nvidia:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$STAGE/site${PYTHONPATH:+:$PYTHONPATH}"
export MLXCEL_BENCH_PYTHON=python3 MLXCEL_BENCH_BIN="$STAGE/bin" PYTHONUNBUFFERED=1
chmod +x "$STAGE"/bin/*

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -m pip list --path "$STAGE/site" 2>/dev/null | grep -iE '^(mlx|mlx-cuda-13|mlx-lm) '
  python3 -m pip list 2>/dev/null | grep -iE '^(transformers|numpy|nvidia-cublas|nvidia-cuda-runtime) '
  python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())'
} > "$OUT/env.txt" 2>&1

status=0
for like in "$@"; do
  model="$MODELS/random-llama-$like"
  [ -f "$model/model.safetensors" ] || python3 "$REPO/bench/random_llama.py" --like "$like" \
    --tokenizer "$STAGE/tokenizer" --out "$model" || { status=1; continue; }
  python3 "$REPO/bench/gpu_throughput.py" --model "$model" --out "$OUT/$like" || status=1
done
exit "$status"
