#!/usr/bin/env bash
# Runs the service in the foreground until Ctrl-C: mlxcel-cachemgr in the background and
# mlxcel-daemon on the default model (the HTTP front end and `mlxcelctl serve`, a real
# supervisor, come with later work). Stopping either stops both.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release"
SOCKET_ARGS=()
if [ -n "${SOCKET_DIR:-}" ]; then SOCKET_ARGS=(--socket-dir "$SOCKET_DIR"); fi

"$BIN/mlxcel-cachemgr" "${SOCKET_ARGS[@]}" &
cachemgr=$!
trap 'kill "$cachemgr" 2>/dev/null || true; wait "$cachemgr" 2>/dev/null || true' EXIT
trap 'exit 0' INT TERM
"$BIN/mlxcel-daemon" --model "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" "${SOCKET_ARGS[@]}"
