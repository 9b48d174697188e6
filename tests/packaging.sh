#!/usr/bin/env bash
# packaging — the release artefacts, as `make check` sees them:
#   make static   → a fully static binary (file, ldd) that runs: --version,
#                   `serve` on a free port answering /health, a unary RPC and
#                   a streamed StartProcess, clean stop on SIGTERM;
#   make install  DESTDIR=<tmp> → <tmp>/sbin/conch-init, executable, the
#                   static binary;
#   make rpm      → an RPM listing only /sbin/conch-init whose payload is the
#                   static binary (rpm --dump digest = sha256 of the file).
# Prints "N passed, N failed"; exits non-zero on any failure.
# Run from anywhere: tests/packaging.sh   (MAKE=… to pick the make binary).
set -u
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
BIN=build/static/conch-init
VERSION=$(sed -n 's/^VERSION *:= *//p' Makefile)

pass=0
fail=0
ok() { echo "ok   - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }
# check DESCRIPTION COMMAND…: the command's status decides.
check() {
  local d=$1
  shift
  if "$@"; then ok "$d"; else bad "$d"; fi
}
summary() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}

tmp=$(mktemp -d)
srv_pid=
cleanup() {
  if [ -n "$srv_pid" ] && kill -0 "$srv_pid" 2>/dev/null; then
    kill "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# ---------------------------------------------------------------- make static
if $MAKE static >"$tmp/static.log" 2>&1 && [ -x "$BIN" ]; then
  ok "make static builds $BIN"
else
  bad "make static builds $BIN"
  tail -20 "$tmp/static.log"
  summary
  exit 1
fi

file_out=$(file -L "$BIN")
check "file says statically linked ($file_out)" grep -q "statically linked" <<<"$file_out"
ldd_out=$(ldd "$BIN" 2>&1)
check "ldd says not a dynamic executable ($ldd_out)" grep -q "not a dynamic executable" <<<"$ldd_out"

ver_out=$("$BIN" --version 2>&1)
check "--version prints 'conch-init $VERSION' (got '$ver_out')" test "$ver_out" = "conch-init $VERSION"

# ---------------------------------------------------------------- serve smoke test
# Port 0: the kernel picks a free port; the log line names it.
token=pkg-$$-$RANDOM
: >"$tmp/serve.log" # exists before the first look below
"$BIN" serve --listen 127.0.0.1:0 --token "$token" >"$tmp/serve.log" 2>&1 &
srv_pid=$!
port=
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*serving agent API addr=[^ ]* port=\([0-9]*\).*/\1/p' "$tmp/serve.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$srv_pid" 2>/dev/null || break
  sleep 0.05
done
if [ -n "$port" ]; then
  ok "serve listens on a free port ($port)"
  url=http://127.0.0.1:$port
  health=$(curl -s --max-time 5 "$url/health")
  check "GET /health → {\"status\":\"OK\",\"message\":\"OK\"} (got '$health')" \
    test "$health" = '{"status":"OK","message":"OK"}'

  list=$(curl -s --max-time 5 "$url/pb.ProcessService/List" -H 'Connect-Protocol-Version: 1' \
    -H 'Content-Type: application/json' -H "conch-init-token: $token" --data '{}')
  check "unary ProcessService/List with the token → {} (got '$list')" test "$list" = '{}'

  # StartProcess is server streaming: one Connect envelope (flags 0, length)
  json='{"cmd":"echo","args":["packaging-ok"]}'
  { printf '\000\000\000\000'; printf "\\$(printf %03o ${#json})"; printf '%s' "$json"; } >"$tmp/start.bin"
  curl -s --max-time 10 "$url/pb.ProcessService/StartProcess" \
    -H 'Content-Type: application/connect+json' -H "conch-init-token: $token" \
    --data-binary "@$tmp/start.bin" -o "$tmp/start.out"
  want=$(printf 'packaging-ok\n' | base64)
  check "streamed StartProcess echo: stdout '$want' in the response" grep -aq "\"stdout\":\"$want\"" "$tmp/start.out"
  check "streamed StartProcess echo: end event status exited" grep -aq '"status":"exited"' "$tmp/start.out"

  kill -TERM "$srv_pid"
  wait "$srv_pid"
  rc=$?
  srv_pid=
  check "serve exits 0 on SIGTERM (rc=$rc)" test "$rc" -eq 0
  if grep -q '\[ERROR\]' "$tmp/serve.log"; then
    bad "no ERROR lines in the serve log"
    grep '\[ERROR\]' "$tmp/serve.log" | head -5
  else
    ok "no ERROR lines in the serve log"
  fi
else
  bad "serve listens on a free port"
  cat "$tmp/serve.log"
fi

# ---------------------------------------------------------------- make install
dest=$tmp/dest
mkdir -p "$dest"
if $MAKE install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
  ok "make install DESTDIR=$dest"
else
  bad "make install DESTDIR=$dest"
  tail -20 "$tmp/install.log"
fi
check "<dest>/sbin/conch-init exists and is executable" test -f "$dest/sbin/conch-init" -a -x "$dest/sbin/conch-init"
check "<dest>/sbin/conch-init is the static binary" cmp -s "$dest/sbin/conch-init" "$BIN"
check "nothing else installed" test "$(cd "$dest" && find . -type f)" = "./sbin/conch-init"

# ---------------------------------------------------------------- make rpm
rm -rf build/rpm/RPMS
if $MAKE rpm >"$tmp/rpm.log" 2>&1; then
  ok "make rpm"
else
  bad "make rpm"
  tail -20 "$tmp/rpm.log"
fi
rpms=$(find build/rpm/RPMS -name '*.rpm' 2>/dev/null)
nrpm=$(printf '%s' "$rpms" | grep -c .)
check "exactly one RPM built ($rpms)" test "$nrpm" -eq 1
if [ "$nrpm" -eq 1 ]; then
  files=$(rpm -qlp "$rpms" 2>/dev/null)
  check "rpm -qlp lists /sbin/conch-init and nothing else (got '$files')" test "$files" = "/sbin/conch-init"
  rpmver=$(rpm -qp --qf '%{VERSION}' "$rpms" 2>/dev/null)
  check "RPM version is $VERSION (got '$rpmver')" test "$rpmver" = "$VERSION"
  # --dump: path size mtime digest mode owner group isconfig isdoc rdev symlink
  read -r dpath dsize _ ddigest dmode _ <<<"$(rpm -qp --dump "$rpms" 2>/dev/null)"
  sha=$(sha256sum "$BIN" | cut -d' ' -f1)
  size=$(stat -c %s "$BIN")
  check "payload /sbin/conch-init has the static binary's sha256 and size" \
    test "$dpath" = /sbin/conch-init -a "$ddigest" = "$sha" -a "$dsize" = "$size"
  check "payload mode is 0100755 (got $dmode)" test "$dmode" = 0100755
fi

summary
