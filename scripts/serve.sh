#!/usr/bin/env bash
# Runs the service in the foreground until Ctrl-C or SIGTERM: mlxcel-cachemgr, mlxcel-daemon on
# the default model, and mlxcel-frontend on http://127.0.0.1:8080 (PORT=... to change it).
# If any process exits, the others are stopped too. (`mlxcelctl serve`, a supervisor with
# restarts, replaces this script in later work.)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release"
SOCKET_ARGS=()
if [ -n "${SOCKET_DIR:-}" ]; then SOCKET_ARGS=(--socket-dir "$SOCKET_DIR"); fi

"$BIN/mlxcel-cachemgr" "${SOCKET_ARGS[@]}" &
cachemgr=$!
"$BIN/mlxcel-daemon" --model "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" "${SOCKET_ARGS[@]}" &
daemon=$!
"$BIN/mlxcel-frontend" --port "${PORT:-8080}" "${SOCKET_ARGS[@]}" &
frontend=$!

stopping=0
stop() {
  stopping=1
  kill -TERM "$frontend" "$daemon" "$cachemgr" 2>/dev/null || true
}
trap stop INT TERM
wait -n "$frontend" "$daemon" "$cachemgr"
status=$?
stop
wait "$frontend" "$daemon" "$cachemgr" 2>/dev/null
# A requested stop is a clean exit; a process that died on its own is a failure.
if [ "$stopping" -eq 1 ] && [ "$status" -gt 128 ]; then exit 0; fi
exit "$status"
