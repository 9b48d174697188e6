#!/usr/bin/env bash
# Two binaries side by side: each benchmark below runs for OLD and NEW in
# turn, ROUNDS times (alternating the order), so that the machine's load
# hits both alike.  Every benchmark prints ratios against its own baseline
# measured in the same run; compare those ratios, not raw times.
#
# Usage: tests/bench/compare.sh OLD_BIN NEW_BIN [ROUNDS]   (root: files.sh mounts a tmpfs)
# Environment: BENCHES ("process files keystroke"), quick sizes by default
#   (process: N=500 SIZE=256 MiB; files: 256 MiB; keystroke: N=500).
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=$(readlink -f "$1"); NEW=$(readlink -f "$2"); ROUNDS=${3:-2}
BENCHES=${BENCHES:-process files keystroke}
OUT=build/bench/compare; mkdir -p "$OUT"
run() { # bench label bin round
  local f="$OUT/$1-$2-$4.txt"
  case $1 in
    process) CONCH_INIT_BIN=$3 N=${N:-500} SIZE=${SIZE:-268435456} REPS=2 tests/bench/process.sh >"$f" 2>&1 ;;
    files) CONCH_INIT_BIN=$3 REPS=2 RATE_ROUNDS=${RATE_ROUNDS:-5} N=${LN:-20000} tests/bench/files.sh ${FILES_MIB:-256} >"$f" 2>&1 ;;
    keystroke) CONCH_INIT_BIN=$3 N=${N:-500} tests/bench/keystroke.sh >"$f" 2>&1 ;;
  esac || echo "($1 $2 round $4 exited $?)" >>"$f"
}
for b in $BENCHES; do
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then run "$b" old "$OLD" "$r"; run "$b" new "$NEW" "$r"
    else run "$b" new "$NEW" "$r"; run "$b" old "$OLD" "$r"; fi
  done
  for r in $(seq "$ROUNDS"); do
    for l in old new; do
      echo "=== $b $l round $r"
      grep -E 'x p50|ratio|ListFiles|StartProcess|GetFile|PostFile|SendInput|StreamInput|RSS|exited' "$OUT/$b-$l-$r.txt" || true
    done
  done
done
