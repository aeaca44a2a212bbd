#!/usr/bin/env bash
# Runs each cargo-fuzz target for a fixed time (seconds, default 60) on the nightly toolchain,
# growing fuzz/corpus/<target>, and prints executions and crashes per target. Exits 1 if any
# target crashed (the inputs are in fuzz/artifacts/<target>/). Not part of `make test`: CI
# replays the corpus on stable instead (ipc/tests/fuzz_corpus.rs, frontend/tests/fuzz_corpus.rs).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_EACH="${1:-60}"
cd "$ROOT/fuzz"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
status=0
summary=""
for target in ipc_frames http_bodies; do
  mkdir -p "corpus/$target" "artifacts/$target"
  before=$(ls "artifacts/$target" | wc -l)
  log="$(mktemp)"
  echo "[fuzz] $target for ${SECONDS_EACH}s (1 job)" >&2
  cargo +nightly fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$SECONDS_EACH" -print_final_stats=1 -rss_limit_mb=2048 >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  after=$(ls "artifacts/$target" | wc -l)
  crashes=$((after - before))
  corpus=$(ls "corpus/$target" | wc -l)
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    status=1
    tail -40 "$log" >&2
  fi
  summary+=$(printf '%-12s %12s executions in %ss, %s new crashes, corpus %s inputs (exit %s)' \
    "$target" "${execs:-?}" "$SECONDS_EACH" "$crashes" "$corpus" "$rc")$'\n'
  rm -f "$log"
done
printf '%s' "$summary"
exit "$status"
