#!/bin/sh
# No product C file over 800 lines (run by `make unit`): a file past it is
# split by concern, as fs/watch*.c, proc/cgroup*.c and init/initproto*.c are.
# Prints each one over the bound and exits 1 if there is any.
cd "$(dirname "$0")/../.." || exit 1
MAX=${MAX_LINES:-800}
fail=0
for f in core/*.c server/*.c init/*.c agent/*.c proto/*.c fs/*.c proc/*.c reflect/*.c net/*.c; do
  n=$(wc -l < "$f")
  if [ "$n" -gt "$MAX" ]; then
    echo "check-sizes: $f has $n lines (over $MAX): split it by concern"
    fail=1
  fi
done
[ $fail = 0 ] && echo "check-sizes: every product C file within $MAX lines"
exit $fail
