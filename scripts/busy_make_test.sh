#!/usr/bin/env bash
# `make test` N times in a row (default 3) in a fresh clone of this repository, while
# `yes > /dev/null` keeps one core busy the whole time: the busy-machine check of the suite.
# The clone reuses this checkout's models/, build/ and .venv (linked) when they exist, so only
# the Rust build starts from nothing. Logs: $OUT/run<i>.log (OUT defaults to a temp dir).
#
# Usage: scripts/busy_make_test.sh [RUNS]
set -u
runs="${1:-3}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$(mktemp -d /tmp/mxbusy.XXXX)}"
clone="$out/clone"
git clone -q "$repo" "$clone" || exit 1
for d in models build .venv; do
  [ -e "$repo/$d" ] && ln -s "$repo/$d" "$clone/$d"
done
cd "$clone" || exit 1
echo "at $(git log --oneline -1); logs in $out"
yes > /dev/null &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
status=0
for i in $(seq "$runs"); do
  start=$(date +%s)
  make test > "$out/run$i.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || status=1
  passed=$(grep "test result" "$out/run$i.log" | awk '{s+=$4} END {print s+0}')
  failed=$(grep "test result" "$out/run$i.log" | awk '{s+=$6} END {print s+0}')
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $passed passed, $failed failed"
done
exit "$status"
