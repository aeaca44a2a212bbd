#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_unstage.sh: mlxcel alone under several settings, one
# after the other (an A/B of switches on one binary, one machine), then, with SIDE=1, both
# servers side by side at the defaults. Each run is bench/gpu_throughput.py on the 8B-like
# random-weight model (written once under MODELS, default /tmp/gpu-models).
#
# Usage: gpu_ab.sh OUT SETTING...
#   SETTING: `default`, or NAME=VALUE[,NAME=VALUE...] (environment for mlxcel's processes).
#   CLIENTS (default 8,32) sets the levels; STAGE (default /tmp/s) is where gpu_unstage.sh put
#   the binaries; LIKE (default 8b) the model.
set -uo pipefail

OUT="$1"
shift
STAGE="${STAGE:-/tmp/s}"
MODELS="${MODELS:-/tmp/gpu-models}"
LIKE="${LIKE:-8b}"
CLIENTS="${CLIENTS:-8,32}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC1091
. "$STAGE/env.sh"
export MLXCEL_BENCH_PYTHON=python3 MLXCEL_BENCH_BIN="$STAGE/bin" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$MODELS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
model="$MODELS/random-llama-$LIKE"
[ -f "$model/model.safetensors" ] || python3 "$REPO/bench/random_llama.py" --like "$LIKE" \
  --tokenizer "$STAGE/tokenizer" --out "$model" > "$OUT/model.log" 2>&1 || exit 1

i=0
for setting in "$@"; do
  i=$((i + 1))
  name="$i-$(echo "$setting" | tr '=,' '-_')"
  (
    if [ "$setting" != default ]; then
      IFS=',' read -ra pairs <<< "$setting"
      for p in "${pairs[@]}"; do export "${p?}"; done
    fi
    python3 "$REPO/bench/gpu_throughput.py" --model "$model" --out "$OUT/$name" \
      --peers mlxcel --clients "$CLIENTS" > "$OUT/$name.log" 2>&1
  )
  echo "== $setting"
  grep -E '^\[gpu\] mlxcel (x[0-9]+|4k)' "$OUT/$name.log" | cut -c1-200
done
if [ "${SIDE:-0}" = 1 ]; then
  python3 "$REPO/bench/gpu_throughput.py" --model "$model" --out "$OUT/side" \
    --clients "$CLIENTS" > "$OUT/side.log" 2>&1
  cat "$OUT/side/gpu_throughput.md"
fi
