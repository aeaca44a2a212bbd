#!/usr/bin/env bash
# Runs the service in the foreground until Ctrl-C or SIGTERM: mlxcel-cachemgr and mlxcel-daemon
# on the default model (the HTTP front end and `mlxcelctl serve`, a real supervisor with
# restarts, come with later work). If either process exits, the other is stopped too.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release"
SOCKET_ARGS=()
if [ -n "${SOCKET_DIR:-}" ]; then SOCKET_ARGS=(--socket-dir "$SOCKET_DIR"); fi

"$BIN/mlxcel-cachemgr" "${SOCKET_ARGS[@]}" &
cachemgr=$!
"$BIN/mlxcel-daemon" --model "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" "${SOCKET_ARGS[@]}" &
daemon=$!

stopping=0
stop() {
  stopping=1
  kill -TERM "$daemon" "$cachemgr" 2>/dev/null || true
}
trap stop INT TERM
wait -n "$daemon" "$cachemgr"
status=$?
stop
wait "$daemon" "$cachemgr" 2>/dev/null
# A requested stop is a clean exit; a process that died on its own is a failure.
if [ "$stopping" -eq 1 ] && [ "$status" -gt 128 ]; then exit 0; fi
exit "$status"
