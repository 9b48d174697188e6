#!/bin/sh
# Layering rules of the services (run by `make unit`); prints each
# violation and exits 1 if there is any.  Usage: check-layers.sh [OBJDIR]
#   1. fs/, proc/, reflect/ and net/ see only server/rpc.h of the daemon (plus bufref.h, which
#      it includes, log.h, senv.h and list.h, the list type: a header with no
#      state): never core/daemon.h, pool.h, slab.h or any other agent/ or
#      init/ header.
#   2. proc/fanout.[ch] only delivers events: it includes no proc/ header
#      but its own and exitfmt.h (the record, proc.h, is above it).
#   3. proc/process.c, the record's owner, includes neither input.h nor
#      service.h: input.c and service.c are above it (process.c opens and
#      shuts a record's input through the table's hooks).
#   4. No two proc/ or fs/ headers include each other, directly or not.
#   6. net/ includes no proc/ or fs/ header: it learns a socket owner's
#      command through the hook agent/main.c registers (net/service.h).
OBJDIR=${1:-}
cd "$(dirname "$0")/../.." || exit 1
fail=0
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(agent\|init\)/' fs/*.[ch] proc/*.[ch] reflect/*.[ch] net/*.[ch] |
      grep -v '"agent/\(rpc\|bufref\|log\|senv\|list\)\.h"')
if [ -n "$bad" ]; then
  echo "check-layers: a service reaches past server/rpc.h:"
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
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"proc/\(input\|service\)\.h"' proc/process.c proc/proc.h)
if [ -n "$bad" ]; then
  echo "check-layers: proc/process.c (the record) reaches up to input/service:"
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
bad=$(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(proc\|fs\)/' net/*.[ch])
if [ -n "$bad" ]; then
  echo "check-layers: net/ reaches into another service:"
  echo "$bad"
  fail=1
fi
# 5. with OBJDIR (make unit passes build/asan/obj): no two proc/ files call
#    each other both ways — a symbol one needs from the other, each way.
if [ -n "$OBJDIR" ]; then
  ls "$OBJDIR"/proc/*.o >/dev/null 2>&1 || { echo "check-layers: no objects in $OBJDIR/proc"; exit 1; }
  T=$(mktemp -d) || exit 1
  for o in "$OBJDIR"/proc/*.o; do
    n=$(basename "$o" .o)
    nm -u "$o" | awk '{print $2}' | sort > "$T/$n.needs"
    nm --defined-only "$o" | awk '$2 ~ /[TDBR]/ {print $3}' | sort > "$T/$n.defs"
  done
  for a in "$T"/*.needs; do
    a=$(basename "$a" .needs)
    for b in "$T"/*.needs; do
      b=$(basename "$b" .needs)
      [ "$a" \< "$b" ] || continue
      ab=$(comm -12 "$T/$a.needs" "$T/$b.defs" | head -1)
      ba=$(comm -12 "$T/$b.needs" "$T/$a.defs" | head -1)
      if [ -n "$ab" ] && [ -n "$ba" ]; then
        echo "check-layers: proc/$a.c and proc/$b.c call each other ($ab / $ba)"
        fail=1
      fi
    done
  done
  rm -rf "$T"
fi
[ $fail = 0 ] && echo "check-layers: ok"
exit $fail
