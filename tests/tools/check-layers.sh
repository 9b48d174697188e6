#!/bin/sh
# The floors of the source tree (docs/internals/README.md "Floors"), run by
# `make unit`; prints each violation and exits 1 if there is any.
#   check-layers.sh [OBJDIR]     OBJDIR: build/asan/obj (the symbol rules)
#
# Floors, bottom up; a folder includes and calls only its own floor's
# allowed folders and those below:
#   0  core/    includes only core/
#      proto/   includes only proto/
#   1  server/  core/, proto/, server/
#   2  fs/ proc/ net/ reflect/ (the services): core/ but its daemon
#               context and pool (daemon.h, pool.h: a service gets its loop
#               from its init function and runs jobs through
#               rpc_work_submit), proto/, their own folder, and of server/
#               only server/rpc.h
#   3  init/    anything but agent/
#   4  agent/   anything
# By includes (quoted #include "dir/…" in every .c and .h) and, with
# OBJDIR, by symbols: no object needs a symbol defined in a file whose
# header its own may not include (for a service: of server/, only names
# rpc.h declares).
# Then, with OBJDIR: no call circle between server/ files (connect.c and
# connect_in.c are one module, h2.c and h2stream.c another), and the rules
# inside the services:
#   2. proc/fanout.[ch] only delivers events: it includes no proc/ header
#      but its own and exitfmt.h (the record, proc.h, is above it).
#   3. proc/process.c, the record's owner, includes neither input.h nor
#      service.h: input.c and service.c are above it (process.c opens and
#      shuts a record's input through the table's hooks).
#   4. No two proc/ or fs/ headers include each other, directly or not.
#   5. (OBJDIR) No two proc/ files call each other both ways.
#   6. net/ includes no proc/ or fs/ header: it learns a socket owner's
#      command through the hook agent/main.c registers (net/service.h).
# Objects whose source is gone (a stale build) are not read; a floor
# folder with sources but no objects in OBJDIR fails the check.
OBJDIR=${1:-}
cd "$(dirname "$0")/../.." || exit 1
DIRS="core proto server fs proc net reflect init agent"
fail=0

# what dir $1 may include: folders, single headers (with a /), and before
# them headers it may not (with a !)
allowed() {
  case $1 in
    core) echo "core" ;;
    proto) echo "proto" ;;
    server) echo "core proto server" ;;
    fs | proc | net | reflect) echo "!core/daemon.h !core/pool.h core proto $1 server/rpc.h" ;;
    init) echo "core proto server fs proc net reflect init" ;;
    agent) echo "$DIRS" ;;
  esac
}

# 1 when path ($2, "dir/file") is allowed for dir $1
may_use() {
  for a in $(allowed "$1"); do
    case $a in
      !*) [ "$2" = "${a#!}" ] && return 1 ;;
      */*) [ "$2" = "$a" ] && return 0 ;;
      *) [ "${2%%/*}" = "$a" ] && return 0 ;;
    esac
  done
  return 1
}

# ---- includes
for d in $DIRS; do
  for f in "$d"/*.c "$d"/*.h; do
    [ -f "$f" ] || continue
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_0-9]*\/[^"]*\)".*/\1/p' "$f" | while read -r inc; do
      case " $DIRS " in *" ${inc%%/*} "*) ;; *) continue ;; esac
      may_use "$d" "$inc" || echo "check-layers: $f includes $inc ($d/ includes only: $(allowed "$d"))"
    done
  done
done >"${TMPDIR:-/tmp}/check-layers.$$"
if [ -s "${TMPDIR:-/tmp}/check-layers.$$" ]; then
  cat "${TMPDIR:-/tmp}/check-layers.$$"
  fail=1
fi
rm -f "${TMPDIR:-/tmp}/check-layers.$$"

# ---- rules inside the services (2, 3, 4, 6)
inc_of() { grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"'"$1" $2 2>/dev/null; }
bad=$(inc_of 'proc/' "proc/fanout.c proc/fanout.h" | grep -v '"proc/\(fanout\|exitfmt\)\.h"')
if [ -n "$bad" ]; then
  echo "check-layers: proc/fanout includes the process record:"
  echo "$bad"
  fail=1
fi
bad=$(inc_of 'proc/\(input\|service\)\.h"' "proc/process.c proc/proc.h")
if [ -n "$bad" ]; then
  echo "check-layers: proc/process.c (the record) reaches up to input/service:"
  echo "$bad"
  fail=1
fi
# include graph of the module headers: a cycle shows as a header reaching itself
for h in fs/*.h proc/*.h; do
  [ -f "$h" ] || continue
  seen=" " todo="$h"
  while [ -n "$todo" ]; do
    set -- $todo
    cur=$1
    shift
    todo="$*"
    [ -f "$cur" ] || continue
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(\(fs\|proc\)\/[^"]*\.h\)".*/\1/p' "$cur"); do
      if [ "$inc" = "$h" ]; then
        echo "check-layers: include cycle through $h (via $cur)"
        fail=1
      fi
      case "$seen" in *" $inc "*) ;; *) seen="$seen$inc " todo="$todo $inc" ;; esac
    done
  done
done
bad=$(inc_of '\(proc\|fs\)/' "$(ls net/*.[ch] 2>/dev/null)")
if [ -n "$bad" ]; then
  echo "check-layers: net/ reaches into another service:"
  echo "$bad"
  fail=1
fi

[ -n "$OBJDIR" ] || { [ $fail = 0 ] && echo "check-layers: ok (includes)"; exit $fail; }

# ---- symbols
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
: >"$T/defs"
: >"$T/needs"
for d in $DIRS; do
  ls "$d"/*.c >/dev/null 2>&1 || continue
  ls "$OBJDIR/$d"/*.o >/dev/null 2>&1 || { echo "check-layers: no objects in $OBJDIR/$d"; fail=1; continue; }
  for o in "$OBJDIR/$d"/*.o; do
    n=$(basename "$o" .o)
    [ -f "$d/$n.c" ] || continue # stale: its source is gone
    nm --defined-only "$o" | awk -v f="$d/$n" '$2 ~ /^[TDBRVWGS]$/ {print $3, f}' >>"$T/defs"
    nm -u "$o" | awk -v f="$d/$n" '{print f, $2}' >>"$T/needs"
  done
done
# the names server/rpc.h declares (what a service may need of server/)
grep -o '[A-Za-z_][A-Za-z0-9_]*' server/rpc.h 2>/dev/null | sort -u >"$T/rpc_names"
# file sym deffile, for every need defined in another file of the tree
awk 'NR == FNR {def[$1] = $2; next} ($2 in def) && def[$2] != $1 {print $1, $2, def[$2]}' \
  "$T/defs" "$T/needs" | sort -u >"$T/edges"
while read -r f sym g; do
  d=${f%%/*} gd=${g%%/*}
  [ "$d" = "$gd" ] && continue
  if may_use "$d" "$g.h"; then continue; fi
  if [ "$gd" = server ] && may_use "$d" server/rpc.h && grep -qx "$sym" "$T/rpc_names"; then continue; fi
  echo "check-layers: $f.c needs $sym, defined in $g.c ($d/ may use only: $(allowed "$d"))"
done <"$T/edges" >"$T/bad"
if [ -s "$T/bad" ]; then
  cat "$T/bad"
  fail=1
fi

# no call circle between server/ files (connect + connect_in, h2 + h2stream:
# one module each)
awk '$1 ~ /^server\// && $3 ~ /^server\// {
       a = $1; b = $3; sub(/_in$/, "", a); sub(/_in$/, "", b)
       sub(/^server\/h2stream$/, "server/h2", a); sub(/^server\/h2stream$/, "server/h2", b)
       if (a != b) print a, b }' "$T/edges" | sort -u >"$T/server_calls"
if ! tsort "$T/server_calls" >/dev/null 2>"$T/loop"; then
  echo "check-layers: a call circle in server/: $(sed -n 's/^tsort: \([a-z_0-9]*\/[a-z_0-9]*\)$/\1.c/p' "$T/loop" | tr '\n' ' ')"
  fail=1
fi

# 5. no two proc/ files call each other both ways
awk '$1 ~ /^proc\// && $3 ~ /^proc\// {print $1, $3}' "$T/edges" | sort -u >"$T/proc_calls"
awk 'NR == FNR {e[$1 " " $2] = 1; next} ($2 " " $1) in e && $1 < $2 {print $1, $2}' \
  "$T/proc_calls" "$T/proc_calls" | while read -r a b; do
  echo "check-layers: $a.c and $b.c call each other"
done >"$T/bad5"
if [ -s "$T/bad5" ]; then
  cat "$T/bad5"
  fail=1
fi

[ $fail = 0 ] && echo "check-layers: ok"
exit $fail
