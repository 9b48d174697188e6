#!/usr/bin/env bash
# tests/fuzz/run.sh SECONDS BIN… — run each libFuzzer driver for SECONDS on
# its corpus (tests/fuzz/corpus/<name>, checked in) plus the work corpus
# build/fuzz/corpus/<name> (new inputs land there); crashes are written to
# build/fuzz/crash/<name>/.  Prints executions and coverage per driver and
# "N passed, N failed".  FUZZ_SEED fixes libFuzzer's seed (make fuzz-smoke
# sets it: the smoke in CI then explores the same inputs every run, so it
# fails on a regression, not on the luck of the draw; make fuzz leaves it
# random).
set -u
cd "$(dirname "$0")/../.."
secs=$1; shift
pass=0 fail=0
for bin in "$@"; do
  name=$(basename "$bin")
  mkdir -p "build/fuzz/corpus/$name" "build/fuzz/crash/$name" "tests/fuzz/corpus/$name"
  log=build/fuzz/$name.log
  if "$bin" ${FUZZ_SEED:+-seed="$FUZZ_SEED"} -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="build/fuzz/crash/$name/" "build/fuzz/corpus/$name" "tests/fuzz/corpus/$name" \
       >"$log" 2>&1; then
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    echo "ok   $name: $execs executions in ${secs} s, $cov"
    pass=$((pass + 1))
  else
    echo "FAIL $name (log: $log)"; grep -E 'ERROR|property failed|SUMMARY' "$log" | head -5
    fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
