#!/usr/bin/env bash
# throwaway: few-row kernel correctness, host cost, steps A/B
set -u
for p in build/gpu-stage/p*; do [ -d "$p" ] && bash scripts/gpu_unstage.sh "$p"; done
. /tmp/s/env.sh
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt
timeout 200 /tmp/s/bin/few_rows_cuda --test-threads 1 --nocapture > $OUT/few_rows_cuda.log 2>&1; echo "test rc $?"
tail -5 $OUT/few_rows_cuda.log
timeout 150 /tmp/s/bin/matmul_rows --bench > $OUT/matmul_rows.log 2>&1; echo "bench rc $?"
cat $OUT/matmul_rows.log | tail -14
