#!/usr/bin/env bash
# On the GPU machine: keeps one part of `scripts/gpu_stage.sh`'s output in /tmp/s, and once every
# part is there joins and unpacks them into the layout scripts/gpu_bench.sh and
# scripts/gpu_check.sh take as STAGE: /tmp/s/site (MLX, mlx-lm), /tmp/s/bin (the CUDA build's
# binaries and test executables), /tmp/s/tokenizer, /tmp/s/model.gguf (the default model), and
# /tmp/s/env.sh (LD_LIBRARY_PATH and PYTHONPATH for them). Files in /tmp last only while the
# machine stays warm between calls.
#
# Usage: gpu_unstage.sh PART_DIR     (e.g. build/gpu-stage/p0, carried by this call)
set -euo pipefail

S="${GPU_STAGE:-/tmp/s}"
PART="$1"
mkdir -p "$S/parts"
# shellcheck disable=SC1091
. "$PART/manifest"
cp "$PART/part" "$S/parts/$(basename "$PART")"
have=$(ls "$S/parts" | wc -l)
if [ "$have" -lt "$parts" ]; then
  echo "[gpu-unstage] $have of $parts parts in $S/parts"
  exit 0
fi
cat $(ls "$S"/parts/p* | sort -V) > "$S/all.bin"
[ "$(md5sum "$S/all.bin" | cut -d' ' -f1)" = "$md5" ] || { echo "[gpu-unstage] checksum mismatch"; exit 1; }
rm -rf "$S/site" "$S/bin" "$S/tokenizer" && mkdir -p "$S/site" "$S/unpack"
head -c "$site" "$S/all.bin" | xz -d | tar xf - -C "$S/site"
head -c "$((site + bins))" "$S/all.bin" | tail -c "$bins" | xz -d | tar xf - -C "$S/unpack"
mv "$S/unpack/bin" "$S/unpack/tokenizer" "$S/" && rmdir "$S/unpack"
tail -c +"$((site + bins + 1))" "$S/all.bin" > "$S/model.gguf"
[ "$(stat -c %s "$S/model.gguf")" = "$gguf" ] || { echo "[gpu-unstage] model size mismatch"; exit 1; }
rm -rf "$S/all.bin" "$S/parts"
chmod +x "$S"/bin/*
nvidia="$(python3 -c 'import glob, sys; print(":".join(sorted({d for p in sys.path for d in glob.glob(p + "/nvidia/*/lib")})))')"
cat > "$S/env.sh" <<ENV
export LD_LIBRARY_PATH="$S/site/mlx/lib:$nvidia:/usr/local/nvidia/lib64"
export PYTHONPATH="$S/site"
ENV
echo "[gpu-unstage] ready in $S: site/, bin/, tokenizer/, model.gguf, env.sh"
