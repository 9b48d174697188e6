#!/bin/sh
# Layering rules of the services (run by `make unit`); prints each
# violation and exits 1 if there is any.
#   1. fs/ and proc/ see only agent/rpc.h of the daemon (plus bufref.h, which
#      it includes, log.h and senv.h): never agent/daemon.h, pool.h, slab.h
#      or any other agent/ or init/ header.
#   2. proc/fanout.[ch] only delivers events: it includes no proc/ header
#      but its own and exitfmt.h (the record, proc.h, is above it).
#   3. No two proc/ or fs/ headers include each other, directly or not.
cd "$(dirname "$0")/../.." || exit 1
fail=0
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(agent\|init\)/' fs/*.[ch] proc/*.[ch] |
      grep -v '"agent/\(rpc\|bufref\|log\|senv\)\.h"')
if [ -n "$bad" ]; then
  echo "check-layers: a service reaches past agent/rpc.h:"
  echo "$bad"
  fail=1
fi
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"proc/' proc/fanout.c proc/fanout.h |
      grep -v '"proc/\(fanout\|exitfmt\)\.h"')
if [ -n "$bad" ]; then
  echo "check-layers: proc/fanout includes the process record:"
  echo "$bad"
  fail=1
fi
# include graph of the module headers: a cycle shows as a header reaching itself
for h in fs/*.h proc/*.h; do
  seen=" " todo="$h"
  while [ -n "$todo" ]; do
    set -- $todo
    cur=$1
    shift
    todo="$*"
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(\(fs\|proc\)\/[^"]*\.h\)".*/\1/p' "$cur"); do
      if [ "$inc" = "$h" ]; then
        echo "check-layers: include cycle through $h (via $cur)"
        fail=1
      fi
      case "$seen" in *" $inc "*) ;; *) seen="$seen$inc " todo="$todo $inc" ;; esac
    done
  done
done
[ $fail = 0 ] && echo "check-layers: ok"
exit $fail
