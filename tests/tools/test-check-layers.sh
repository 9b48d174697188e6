#!/usr/bin/env bash
# The self-test of tests/tools/check-layers.sh (run by `make unit`): it
# passes on the tree as it is (with build/asan/obj when given), and fails,
# naming the file, on copies of the tree with one include more that a
# floor forbids, and on small trees whose compiled objects call upward,
# around a circle in server/, or past server/rpc.h.  Prints
# `N passed, N failed`; exits 1 when a case failed.
#   test-check-layers.sh [OBJDIR]
cd "$(dirname "$0")/../.." || exit 1
OBJDIR=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
DIRS="core proto server fs proc net reflect init agent"

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "test-check-layers: FAIL: $*"; }

# run the checker of tree $2 (with OBJDIR $3, may be empty); expect exit 1
# and the text $4 in its output
expect_fail() {
  local name=$1 tree=$2 obj=$3 want=$4 out rc
  out=$("$tree/tests/tools/check-layers.sh" $obj 2>&1)
  rc=$?
  if [ $rc -ne 1 ]; then
    bad "$name: exit $rc, want 1"
    printf '%s\n' "$out" | tail -5
  elif ! grep -qF -- "$want" <<<"$out"; then
    bad "$name: the output does not name '$want'"
    printf '%s\n' "$out" | tail -5
  else
    ok
  fi
}

expect_pass() {
  local name=$1 tree=$2 obj=$3 out rc
  out=$("$tree/tests/tools/check-layers.sh" $obj 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then ok; else bad "$name: exit $rc, want 0"; printf '%s\n' "$out" | tail -5; fi
}

# the real tree passes
expect_pass "real tree" . "$OBJDIR"

# ---- includes: a copy of the sources with one include more
copy_tree() {
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree/tests/tools"
  cp tests/tools/check-layers.sh "$tmp/tree/tests/tools/"
  for d in $DIRS; do cp -r "$d" "$tmp/tree/"; done
}
# add_include FILE HEADER: the include after the file's first one
add_include() {
  sed -i "0,/^#include/s|^#include.*|&\n#include \"$2\"|" "$tmp/tree/$1"
  grep -q "#include \"$2\"" "$tmp/tree/$1" || bad "could not add $2 to $1"
}
include_case() {
  copy_tree
  add_include "$1" "$2"
  expect_fail "$1 includes $2" "$tmp/tree" "" "$1 includes $2"
}
copy_tree
expect_pass "the copy as it is" "$tmp/tree" ""
include_case core/log.c server/conn.h
include_case core/pool.h proto/json.h
include_case proto/json.c core/log.h
include_case server/users.c proc/proc.h
include_case server/router.c agent/metrics.h
include_case fs/path.c server/conn.h
include_case proc/reaper.c init/pid1.h
include_case net/relay.c proc/proc.h
include_case reflect/service.c fs/path.h
include_case fs/path.c core/pool.h
include_case init/boot.c agent/upgrade.h
copy_tree
add_include fs/path.c server/rpc.h
expect_pass "a service includes server/rpc.h" "$tmp/tree" ""

# ---- symbols: a small tree, compiled
# mini FILE:BODY...: each file dir/name.c with that body, compiled into $tmp/mini/obj
mini() {
  rm -rf "$tmp/mini"
  mkdir -p "$tmp/mini/tests/tools" "$tmp/mini/server"
  cp tests/tools/check-layers.sh "$tmp/mini/tests/tools/"
  printf 'int rpc_send(int n);\n' >"$tmp/mini/server/rpc.h"
  local spec f body
  for spec in "$@"; do
    f=${spec%%:*} body=${spec#*:}
    mkdir -p "$tmp/mini/$(dirname "$f")" "$tmp/mini/obj/$(dirname "$f")"
    printf '%s\n' "$body" >"$tmp/mini/$f"
    cc -c -w -o "$tmp/mini/obj/${f%.c}.o" "$tmp/mini/$f" || bad "cannot compile $f"
  done
}
BASE=("core/log.c:int log_it(int n) { return n; }"
  "server/connect.c:int connect_in_body(int); int log_it(int); int rpc_send(int n) { return connect_in_body(n); } int connect_step(int n) { return log_it(n); }"
  "server/connect_in.c:int connect_step(int); int connect_in_body(int n) { return connect_step(n); }"
  "server/hx.c:int hx_write(int n) { return n; }"
  "fs/ops.c:int rpc_send(int); int fs_op(int n) { return rpc_send(n); }"
  "agent/main.c:int fs_op(int); int main(void) { return fs_op(0); }")
mini "${BASE[@]}"
expect_pass "calls down, connect <-> connect_in" "$tmp/mini" "$tmp/mini/obj"

mini "${BASE[@]}" "core/up.c:int hx_write(int); int up(void) { return hx_write(1); }"
expect_fail "core calls server" "$tmp/mini" "$tmp/mini/obj" "core/up.c needs hx_write, defined in server/hx.c"

mini "${BASE[@]}" "fs/past.c:int hx_write(int); int past(void) { return hx_write(1); }"
expect_fail "a service calls past rpc.h" "$tmp/mini" "$tmp/mini/obj" "fs/past.c needs hx_write, defined in server/hx.c"

mini "${BASE[@]}" "core/pool.c:int pool_submit(int n) { return n; }" "proc/job.c:int pool_submit(int); int job(void) { return pool_submit(1); }"
expect_fail "a service calls the pool" "$tmp/mini" "$tmp/mini/obj" "proc/job.c needs pool_submit, defined in core/pool.c"

mini "${BASE[@]}" "net/other.c:int fs_op(int); int other(void) { return fs_op(1); }"
expect_fail "a service calls another" "$tmp/mini" "$tmp/mini/obj" "net/other.c needs fs_op, defined in fs/ops.c"

mini "${BASE[@]}" "init/pid1.c:int main_serve(void); int pid1(void) { return main_serve(); }" \
  "agent/serve.c:int main_serve(void) { return 0; }"
expect_fail "init calls agent" "$tmp/mini" "$tmp/mini/obj" "init/pid1.c needs main_serve, defined in agent/serve.c"

mini "${BASE[@]}" "server/a.c:int b(void); int a(void) { return b(); }" \
  "server/b.c:int c(void); int b(void) { return c(); }" "server/c.c:int a(void); int c(void) { return a(); }"
expect_fail "a circle in server/" "$tmp/mini" "$tmp/mini/obj" "a call circle in server/"

mini "${BASE[@]}" "proc/one.c:int two(void); int one(void) { return two(); }" \
  "proc/two.c:int one(void); int two(void) { return one(); }"
expect_fail "two proc/ files call each other" "$tmp/mini" "$tmp/mini/obj" "proc/one.c and proc/two.c call each other"

mini "${BASE[@]}"
rm "$tmp/mini/fs/ops.c" # its object is stale now: not read, and fs/ has no sources left
expect_pass "a stale object" "$tmp/mini" "$tmp/mini/obj"

mini "${BASE[@]}" "proc/x.c:int x(void) { return 0; }"
rm -r "$tmp/mini/obj/proc"
expect_fail "a folder without objects" "$tmp/mini" "$tmp/mini/obj" "no objects in $tmp/mini/obj/proc"

echo "test-check-layers: $pass passed, $fail failed"
[ $fail -eq 0 ]
