#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_unstage.sh: starts the daemon alone under each setting,
# one after the other, until it listens, and keeps its log: where a start's time goes (loading,
# each warm-up stage, kernels built against those the cache gave it). The first start on a
# machine builds every kernel; later ones find them in the cache.
#
# Usage: gpu_warmup.sh OUT SETTING...
#   SETTING: `default`, or NAME=VALUE[,NAME=VALUE...] (environment for the daemon).
#   STAGE (default /tmp/s), MODELS (default /tmp/gpu-models) and LIKE (default 8b) as in
#   gpu_ab.sh; BATCH (default 32) is the daemon's --max-batch-size.
set -uo pipefail

OUT="$1"
shift
STAGE="${STAGE:-/tmp/s}"
MODELS="${MODELS:-/tmp/gpu-models}"
LIKE="${LIKE:-8b}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC1091
. "$STAGE/env.sh"
mkdir -p "$OUT" "$MODELS"
model="$MODELS/random-llama-$LIKE"
[ -f "$model/model.safetensors" ] || python3 "$REPO/bench/random_llama.py" --like "$LIKE" \
  --tokenizer "$STAGE/tokenizer" --out "$model" > "$OUT/model.log" 2>&1 || exit 1

i=0
for setting in "$@"; do
  i=$((i + 1))
  name="$i-$(echo "$setting" | tr '=,' '-_')"
  sockets="$(mktemp -d)"
  (
    if [ "$setting" != default ]; then
      IFS=',' read -ra pairs <<< "$setting"
      for p in "${pairs[@]}"; do export "${p?}"; done
    fi
    exec "$STAGE/bin/mlxcel-daemon" --model "$model" --socket-dir "$sockets" \
      --max-batch-size "${BATCH:-32}" \
      --log-level "info,mlxcel_daemon::backend::cuda::padded=debug,mlxcel_daemon::engine::warmup=debug,mlxcel_daemon::nvrtc_tap=debug"
  ) > "$OUT/$name.log" 2>&1 &
  pid=$!
  started=$(date +%s%N)
  # Until it listens or ends (a failed start ends it).
  while kill -0 "$pid" 2>/dev/null && ! grep -q "daemon listening" "$OUT/$name.log"; do
    sleep 0.2
  done
  took=$(( ($(date +%s%N) - started) / 1000000 ))
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  rm -rf "$sockets"
  echo "== $setting: listening after ${took} ms"
  grep -E "kernels found|model loaded|warm-up" "$OUT/$name.log" | sed -E 's/^[^ ]+ +//' | cut -c1-220
done
