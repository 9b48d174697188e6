#!/usr/bin/env bash
# The self-test of tests/tools/check-api-doc.py (run by `make unit`): it
# passes on the tree as it is, and fails — naming the symbol or text — on
# copies with one thing added that docs/api.md does not name: a field, an
# RPC, a message, an enum value (agent.proto), a JSON name the doc lost,
# and error texts in a new C file, one per scanner rule (A: a statement
# with an RPC_* code; B: a message argument of a function defined with a
# `const char *msg`; C: snprintf into an error buffer).  Prints
# `N passed, N failed`; exits 1 when a case failed.
cd "$(dirname "$0")/../.." || exit 1
py=/usr/bin/python3
chk=tests/tools/check-api-doc.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "test-check-api-doc: FAIL: $*"; }

# run the checker with "$@"; expect exit 1 and every further word of
# $want in its output
expect_fail() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$py" "$chk" "$@" 2>&1)
  rc=$?
  if [ $rc -ne 1 ]; then
    bad "$name: exit $rc, want 1"
    printf '%s\n' "$out" | tail -5
    return
  fi
  local w
  for w in $want; do
    if ! grep -q -- "$w" <<<"$out"; then
      bad "$name: the output does not name $w"
      printf '%s\n' "$out" | tail -5
      return
    fi
  done
  ok
}

# the real tree passes
out=$("$py" "$chk" 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q ' 0 failed$' <<<"$out"; then ok; else bad "real tree: exit $rc"; printf '%s\n' "$out" | tail -5; fi

# a new field in a message
sed 's/^  bool is_directory = 8;$/&\n  string frobnication_level = 9;/' proto/agent.proto >"$tmp/field.proto"
grep -q frobnication_level "$tmp/field.proto" || bad "could not add the field"
expect_fail "new field" "FileEntry.frobnication_level frobnicationLevel" --proto "$tmp/field.proto"

# a new RPC
sed 's/^  rpc Stat(StatRequest) returns (StatResponse);$/&\n  rpc Frobnicate(StatRequest) returns (StatResponse);/' proto/agent.proto >"$tmp/rpc.proto"
grep -q Frobnicate "$tmp/rpc.proto" || bad "could not add the RPC"
expect_fail "new rpc" "pb.FileService.Frobnicate /pb.FileService/Frobnicate" --proto "$tmp/rpc.proto"

# a new message and a new enum value
{ cat proto/agent.proto; printf 'message FrobnicateRequest {\n  string widget_name = 1;\n}\n'; } >"$tmp/msg.proto"
sed -i 's/^  EVENT_TYPE_CHMOD = 5;$/&\n  EVENT_TYPE_FROBNICATE = 6;/' "$tmp/msg.proto"
expect_fail "new message, new enum value" "FrobnicateRequest widgetName EVENT_TYPE_FROBNICATE" --proto "$tmp/msg.proto"

# the doc loses a JSON name
sed 's/`stdinOpen`/`stdin_open`/g' docs/api.md >"$tmp/api.md"
expect_fail "lost JSON name" "StartProcessRequest.stdin_open stdinOpen" --doc "$tmp/api.md"

# new error texts in a new C file, one per rule
mkdir -p "$tmp/src"
cat >"$tmp/src/frob.c" <<'EOF'
/* not compiled: the checker's self-test */
#define FROB_TEXT "frobnication queue is jammed"
static void frob_fail(frob *f, const char *msg) { rpc_finish(f->call, RPC_ABORTED, msg); }
static void frob_on_request(rpc_call *c, const ProtobufCMessage *m) {
  if (!m) {
    rpc_finishf(c, RPC_INVALID_ARGUMENT, "frobnication of %s is not permitted", "it");
    return;
  }
  frob_fail(NULL, "frobnicator went away");
  LOG_INFO("frobnication log line %d is no error text", 1);
}
static rpc_code frob_check(int n, char *err, size_t errlen) {
  if (n > 3) {
    snprintf(err, errlen, "frobnication depth %d exceeds %u", n, 3u);
    return -1;
  }
  rpc_finish(NULL, RPC_RESOURCE_EXHAUSTED, FROB_TEXT);
  return 0;
}
EOF
out=$("$py" "$chk" --src core --src server --src agent --src fs --src proc --src proto --src reflect --src "$tmp/src" 2>&1)
rc=$?
if [ $rc -ne 1 ]; then
  bad "new error texts: exit $rc, want 1"
else
  for t in "frobnication of %s is not permitted" "frobnicator went away" "frobnication depth %d exceeds %u" \
    "frobnication queue is jammed"; do
    if grep -qF "'$t'" <<<"$out"; then ok; else bad "new error texts: the output does not name '$t'"; fi
  done
  if grep -q 'log line' <<<"$out"; then bad "new error texts: a LOG_ text was taken"; else ok; fi
fi

echo "test-check-api-doc: $pass passed, $fail failed"
[ $fail -eq 0 ]
