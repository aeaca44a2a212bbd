#!/usr/bin/env bash
# `make test`, off macOS: type-checks every crate for aarch64-apple-darwin (launchd, peer
# credentials, runtime directories, and the daemon with Metal's path), so a macOS-only break
# shows up on Linux too. MLX itself cannot be built here for Apple's targets: the patched mlx-sys
# (scripts/patch_mlx_sys.py) builds nothing for such a check and generates its bindings for the
# host. On macOS the normal build covers it. Skipped, with a clear line, when the target cannot
# be installed.
set -euo pipefail
TARGET=aarch64-apple-darwin
[ "$(uname -s)" = Darwin ] && exit 0
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  if ! rustup target add "$TARGET" >/dev/null 2>&1; then
    echo "[check-macos] SKIPPED: the $TARGET target cannot be installed here (rustup target add failed)"
    exit 0
  fi
fi
echo "[check-macos] cargo check --target $TARGET (every crate, the daemon included)"
# Warnings are errors here too, as `make lint` makes them on Linux.
RUSTFLAGS="${RUSTFLAGS:-} -D warnings" exec "${CARGO:-cargo}" check --quiet --target "$TARGET" --all-targets \
  -p mlxcel-ipc -p mlxcel-config -p mlxcel-cachemgr -p mlxcel-frontend -p mlxcel-ctl \
  -p mlxcel-daemon
