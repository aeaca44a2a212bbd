#!/usr/bin/env bash
# `make test`, off macOS: type-checks the crates that hold macOS-only code (launchd, peer
# credentials, runtime directories) for aarch64-apple-darwin, so a macOS-only break shows up on
# Linux too. The daemon is left out (mlx-sys builds MLX with Apple's toolchain). On macOS the
# normal build covers it. Skipped, with a clear line, when the target cannot be installed.
set -euo pipefail
TARGET=aarch64-apple-darwin
[ "$(uname -s)" = Darwin ] && exit 0
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  if ! rustup target add "$TARGET" >/dev/null 2>&1; then
    echo "[check-macos] SKIPPED: the $TARGET target cannot be installed here (rustup target add failed)"
    exit 0
  fi
fi
echo "[check-macos] cargo check --target $TARGET (ipc, config, cachemgr, frontend, ctl)"
exec "${CARGO:-cargo}" check --quiet --target "$TARGET" --all-targets \
  -p mlxcel-ipc -p mlxcel-config -p mlxcel-cachemgr -p mlxcel-frontend -p mlxcel-ctl
