#!/usr/bin/env bash
# Packs what a GPU machine without network needs (MLX's CUDA wheel, mlx, mlx-lm, the CUDA build's
# binaries and test executables, SmolLM2's tokenizer and the default model) into parts small
# enough to carry one per call, and the way back: on the GPU machine, `scripts/gpu_unstage.sh
# PART_DIR` for each part, in any order, then source /tmp/s/env.sh.
#
# Usage: gpu_stage.sh CUDA_TREE [OUT]
#   CUDA_TREE: a checkout set up with `MLXCEL_BACKEND=cuda bash scripts/setup.sh` and built
#   there (`cargo build --release --bins`, `cargo build --release --benches -p mlxcel-daemon`,
#   `cargo test --release --no-run --features mlxcel-daemon/cuda -p mlxcel-daemon --test golden --test archs --test
#   few_rows_cuda --test attention_cuda --test table_attention_cuda -p mlxcel-tests --test daemon_e2e --test
#   pipelined_decode --test constrained_decode`). OUT (default build/gpu-stage, ignored by git) gets
#   p0/, p1/, ...: carry each as one call's `carry` path. PART_BYTES (default 58000000) bounds
#   a part: the working tree travels with it and a call takes 64 MB in all. BENCH_ONLY=1 packs
#   the binaries and the two bench executables (steps, matmul_rows) alone (no test executables,
#   no default model: benchmarks on a random-weight model need neither), 2 parts instead of 4;
#   EXTRA_TESTS names test executables to pack beside them.
set -euo pipefail

TREE="$(cd "$1" && pwd)"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${2:-$REPO/build/gpu-stage}"
PART_BYTES="${PART_BYTES:-58000000}"
WORK="$REPO/build/gpu-stage-work"
say() { echo "[gpu-stage] $*"; }

mkdir -p "$WORK/wheels"
if [ ! -f "$WORK/site.tar.xz" ]; then
  say "downloading the wheels (Python 3.12, manylinux x86-64)"
  "$REPO/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 -d "$WORK/wheels" \
    mlx-cuda-13==0.32.4 mlx==0.32.4 mlx-lm==0.32.2
  rm -rf "$WORK/site" && mkdir -p "$WORK/site"
  for w in "$WORK"/wheels/*.whl; do (cd "$WORK/site" && unzip -qo "$w"); done
  say "compressing the unpacked wheels (xz, ~2 min)"
  tar cf - -C "$WORK/site" . | xz -T0 -9 > "$WORK/site.tar.xz.tmp"
  mv "$WORK/site.tar.xz.tmp" "$WORK/site.tar.xz"
fi

newest() { ls -t "$TREE"/target/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -n 1; }
rm -rf "$WORK/bin" && mkdir -p "$WORK/bin/bin" "$WORK/bin/tokenizer"
for b in mlxcel-daemon mlxcel-frontend mlxcel-cachemgr mlxcelctl; do
  cp "$TREE/target/release/$b" "$WORK/bin/bin/"
done
tests="steps matmul_rows golden archs few_rows_cuda attention_cuda table_attention_cuda daemon_e2e pipelined_decode constrained_decode"
[ "${BENCH_ONLY:-0}" = 1 ] && tests="steps matmul_rows ${EXTRA_TESTS:-}"
for t in $tests; do
  f="$(newest "$t")"
  [ -n "$f" ] || { say "no $t executable under $TREE/target/release/deps: build it first"; exit 1; }
  cp "$f" "$WORK/bin/bin/$t"
done
tok="$REPO/models/SmolLM2-135M-Instruct-mlx"
[ -f "$tok/tokenizer.json" ] || { say "no $tok: run \`make bench-setup\` first"; exit 1; }
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$tok"/config.json "$WORK/bin/tokenizer/"
# The test executables look for the checkout they were built in (gpu_check.sh's BUILT_ROOT).
echo "$TREE" > "$WORK/bin/bin/built_root"
tar cf - -C "$WORK/bin" . | xz -T0 -6 > "$WORK/bins.tar.xz"

gguf="$REPO/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "${BENCH_ONLY:-0}" = 1 ]; then
  gguf="$WORK/no-model.gguf" && : > "$gguf"
fi
cat "$WORK/site.tar.xz" "$WORK/bins.tar.xz" "$gguf" > "$WORK/all.bin"
rm -rf "$OUT" && mkdir -p "$OUT"
(cd "$WORK" && split -b "$PART_BYTES" -d -a 1 all.bin part.)
parts=$(ls "$WORK"/part.* | wc -l)
for f in "$WORK"/part.*; do
  i="${f##*.}"
  mkdir -p "$OUT/p$i"
  mv "$f" "$OUT/p$i/part"
  # Each part carries the manifest: sizes of the three pieces, the part count, the checksum.
  {
    echo "parts=$parts"
    echo "site=$(stat -c %s "$WORK/site.tar.xz")"
    echo "bins=$(stat -c %s "$WORK/bins.tar.xz")"
    echo "gguf=$(stat -c %s "$gguf")"
    echo "md5=$(md5sum "$WORK/all.bin" | cut -d' ' -f1)"
  } > "$OUT/p$i/manifest"
done
rm -f "$WORK/all.bin"
say "$parts parts under $OUT (carry each, e.g. build/gpu-stage/p0, with \`bash scripts/gpu_unstage.sh build/gpu-stage/p0\`)"
