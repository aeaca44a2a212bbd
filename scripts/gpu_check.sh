#!/usr/bin/env bash
# The GPU half of the tests, on a Linux machine with an NVIDIA GPU, its driver and the CUDA 13
# libraries (e.g. pip's nvidia-* wheels), and no network: the golden tests and the daemon's
# end-to-end test built against MLX's CUDA wheel (`MLXCEL_BACKEND=cuda make setup`), plus the
# daemon's own startup log (backend, warm-up time). Results go to OUT.
#
# Usage: gpu_check.sh STAGE OUT
#   STAGE (scripts/gpu_stage.sh + gpu_unstage.sh make one) holds site/ (MLX unpacked) or mlx.whl
#   (mlx-cuda-13, the version setup pins), model.gguf (the default model) and
#   bin/ (mlxcel-daemon, mlxcel-cachemgr and the `golden`, `archs`, `few_rows_cuda`, `attention_cuda`,
#   `table_attention_cuda`, `daemon_e2e`, `pipelined_decode` and `constrained_decode` test
#   executables, as `cargo test --release --no-run --features mlxcel-daemon/cuda -p
#   mlxcel-daemon --test golden --test archs --test few_rows_cuda --test attention_cuda --test
#   table_attention_cuda -p mlxcel-tests --test daemon_e2e --test pipelined_decode --test
#   constrained_decode` built them). The test kit finds the
#   binaries beside the test executable; the tests look for the checkout they were built in
#   (it holds models/): BUILT_ROOT names it (default: the one gpu_stage.sh recorded, else
#   /work/main). BUILT_TARGET (default
#   /tmp/cudat/release) gets copies of the binaries too, for executables built before the kit
#   looked beside itself.
set -uo pipefail

STAGE="$1"
OUT="$2"
BUILT_TARGET="${BUILT_TARGET:-/tmp/cudat/release}"
BUILT_ROOT="${BUILT_ROOT:-$(cat "$STAGE/bin/built_root" 2>/dev/null || echo /work/main)}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"

# MLX already unpacked (scripts/gpu_unstage.sh), or the wheel to install; pip wants its own name.
if [ ! -d "$STAGE/site/mlx" ]; then
  mkdir -p "$STAGE/wheel"
  cp "$STAGE/mlx.whl" "$STAGE/wheel/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$STAGE/site" "$STAGE"/wheel/*.whl || exit 1
fi
# The NVIDIA libraries wherever Python's packages are, then the driver's usual places.
nvidia="$(python3 -c 'import glob, sys; print(":".join(sorted({d for p in sys.path for d in glob.glob(p + "/nvidia/*/lib")})))')"
export LD_LIBRARY_PATH="$STAGE/site/mlx/lib:$nvidia:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"

mkdir -p "$BUILT_TARGET"
cp "$STAGE"/bin/mlxcel-daemon "$STAGE"/bin/mlxcel-cachemgr "$BUILT_TARGET/"
if [ ! -e "$BUILT_ROOT" ]; then
  mkdir -p "$(dirname "$BUILT_ROOT")"
  ln -s "$REPO" "$BUILT_ROOT"
fi
mkdir -p "$BUILT_ROOT/models"
cp "$STAGE/model.gguf" "$BUILT_ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
printf '{"temperature": 0.2, "top_p": 0.9}\n' > "$BUILT_ROOT/models/SmolLM2-135M-Instruct.Q4_1.generation_config.json"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -m pip show mlx-cuda-13 --path "$STAGE/site" 2>/dev/null | grep -E '^(Name|Version)' || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$OUT/env.txt" 2>&1

# The golden tests first: they prove the GPU path and take ~2 min, where a fresh machine's
# first daemon start alone can take longer (SmolLM2's Q4_1 kernels: ~140 s).
status=0
"$STAGE/bin/golden" --test-threads 1 --nocapture > "$OUT/golden.log" 2>&1 || status=1
# Each architecture against mlx_lm's reference, in float16 on the GPU (daemon/tests/archs.rs).
"$STAGE/bin/archs" --test-threads 1 --nocapture > "$OUT/archs.log" 2>&1 || status=1
"$STAGE/bin/few_rows_cuda" --test-threads 1 --nocapture > "$OUT/few_rows_cuda.log" 2>&1 || status=1
"$STAGE/bin/attention_cuda" --test-threads 1 --nocapture > "$OUT/attention_cuda.log" 2>&1 || status=1
"$STAGE/bin/table_attention_cuda" --test-threads 1 --nocapture > "$OUT/table_attention_cuda.log" 2>&1 || status=1
# The daemon alone: which backend, how long loading and warm-up took, until it listens.
dir="$(mktemp -d /tmp/mxg.XXXX)"
"$BUILT_TARGET/mlxcel-daemon" --socket-dir "$dir" --model "$BUILT_ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  > "$OUT/daemon_startup.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -S "$dir/daemon.sock" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null

"$STAGE/bin/daemon_e2e" --test-threads 1 > "$OUT/daemon_e2e.log" 2>&1 || status=1
"$STAGE/bin/pipelined_decode" --test-threads 1 > "$OUT/pipelined_decode.log" 2>&1 || status=1
"$STAGE/bin/constrained_decode" --test-threads 1 > "$OUT/constrained_decode.log" 2>&1 || status=1
grep -h -E "^test |test result|golden: on|skipped|on the GPU|tokens equal" "$OUT"/golden.log \
  "$OUT"/archs.log "$OUT"/few_rows_cuda.log \
  "$OUT"/attention_cuda.log "$OUT"/table_attention_cuda.log \
  "$OUT"/daemon_e2e.log "$OUT"/pipelined_decode.log "$OUT"/constrained_decode.log
grep -E "backend|warm|listening" "$OUT/daemon_startup.log" | head -5
exit "$status"
