#!/usr/bin/env bash
# All benchmarks; each prints ratios against a baseline measured in the same run.
set -u
cd "$(dirname "$0")"
status=0
for b in files.sh process.sh floor.sh contend.sh users.sh boot.sh; do
  [ -x "$b" ] || continue
  echo "== $b"; ./"$b" || status=1
done
echo "== upgrade.py"; ./upgrade.py || status=1
exit $status
