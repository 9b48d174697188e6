#!/usr/bin/env bash
# packaging — the release artefacts, as `make check` sees them:
#   make static   → a fully static binary (file, ldd) that runs: --version,
#                   `serve` on a free port answering /health, a unary RPC and
#                   a streamed StartProcess, clean stop on SIGTERM;
#   make install  DESTDIR=<tmp> → <tmp>/sbin/conch-init, executable, the
#                   static binary;
#   make dist     → build/conch-init-VERSION.tar.gz, the same bytes twice,
#                   exactly the tracked files but the fuzz corpora and .ci/,
#                   sorted, 0/0, the last commit's mtime, gzip -n;
#   make rpm      → a .src.rpm holding that tarball and the binary RPMs
#                   rebuilt from it, x86_64 and (--target aarch64, cross)
#                   aarch64 (%check = the unit tests, the arm64 ones under
#                   qemu-user): /sbin/conch-init and docs, no requires, the
#                   right %{ARCH}, the payload runs (rpm2cpio | cpio; the
#                   aarch64 one under qemu-aarch64-static);
#   make deb      → build/conch-init_VERSION_ARCH.deb, the same bytes twice,
#                   /sbin/conch-init (the static binary), copyright, docs;
#                   lintian: no error; dpkg installs it into an empty root,
#                   the binary runs, dpkg --purge removes it; and dpkg -i
#                   inside a mmdebstrap (essential) bookworm chroot;
#                   and build/conch-init_VERSION_arm64.deb, the same bytes
#                   twice, the same files, build/static-arm64's binary
#                   (file: ARM aarch64, static; runs under qemu-user),
#                   Built-Using from the arm64 sysroot, lintian: no error.
# Prints how far into the run each step ends ("make rpm done at 95s").
# Prints "N passed, N failed"; exits non-zero on any failure.
# Run from anywhere: tests/packaging.sh   (MAKE=… to pick the make binary).
set -u
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
BIN=build/static/conch-init
BIN_ARM64=build/static-arm64/conch-init
VERSION=$(sed -n 's/^VERSION *:= *//p' Makefile)
HOST_CPU=$(uname -m)
# arm64 packages are cross-built (and checked under qemu-user) unless this
# machine is arm64 itself, when the native ones are they
CROSS=1
[ "$HOST_CPU" = aarch64 ] && CROSS=0

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
# took WHAT: how long the run has taken so far (where the minutes go)
took() { echo "     ($1 done at ${SECONDS}s)"; }
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
  took "make static"
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

# ---------------------------------------------------------------- make dist
TAR=build/conch-init-$VERSION.tar.gz
if $MAKE dist >"$tmp/dist.log" 2>&1 && [ -f "$TAR" ]; then
  ok "make dist builds $TAR"
else
  bad "make dist builds $TAR"
  tail -20 "$tmp/dist.log"
fi
sha1=$(sha256sum "$TAR" 2>/dev/null | cut -d' ' -f1)
touch Makefile # a newer mtime on a tracked file must not matter
$MAKE dist >>"$tmp/dist.log" 2>&1
sha2=$(sha256sum "$TAR" 2>/dev/null | cut -d' ' -f1)
check "two make dist runs give the same bytes (sha256 $sha1)" test -n "$sha1" -a "$sha1" = "$sha2"
# the names: every tracked file but the fuzz corpora and .ci/, under conch-init-VERSION/
tar -tzf "$TAR" | grep -v '/$' >"$tmp/dist.names"
git ls-files | grep -v -e '^tests/fuzz/corpus/' -e '^\.ci/' | sed "s|^|conch-init-$VERSION/|" | LC_ALL=C sort >"$tmp/want.names"
check "the tarball holds exactly the tracked files but fuzz corpora and .ci/" cmp -s "$tmp/dist.names" "$tmp/want.names"
check "the tarball's names are sorted" cmp -s "$tmp/dist.names" <(LC_ALL=C sort "$tmp/dist.names")
check "no build outputs or node_modules in the tarball" \
  test -z "$(grep -E -e "^conch-init-$VERSION/build/" -e node_modules -e '\.o$' "$tmp/dist.names")"
took "make dist (twice)"
ct=$(git log -1 --format=%ct)
tar -tzvf "$TAR" --numeric-owner --full-time --utc >"$tmp/dist.long"
check "every entry is owned 0/0" test -z "$(awk '$2 != "0/0"' "$tmp/dist.long")"
when=$(date -u -d "@$ct" '+%Y-%m-%d %H:%M:%S')
check "every entry's mtime is the last commit's ($when)" \
  test -z "$(awk -v w="$when" '($4 " " $5) != w' "$tmp/dist.long")"
check "gzip header carries no name and no time" test "$(head -c 8 "$TAR" | od -An -tx1 | tr -d ' \n')" = 1f8b080000000000
spec_ver=$(tar -xzOf "$TAR" "conch-init-$VERSION/conch-init.spec" | sed -n 's/^Version: *//p')
check "the spec in the tarball says Version: $VERSION (got '$spec_ver')" test "$spec_ver" = "$VERSION"
clv=$(sed -n '/^%changelog/{n;s/.* - \([^ -]*\)-[^ ]*$/\1/p;q}' conch-init.spec)
check "the spec's newest %changelog entry is $VERSION (got '$clv')" test "$clv" = "$VERSION"

# ---------------------------------------------------------------- make rpm
# .src.rpm from the tarball, the binary RPMs by rpmbuild --rebuild of it
# (%build the static build, %check the unit tests, from the tarball alone):
# the build machine's CPU, and (--target aarch64, a cross build, the unit
# tests under qemu-user) aarch64.
if $MAKE rpm >"$tmp/rpm.log" 2>&1; then
  ok "make rpm (rpmbuild -ts, then rpmbuild --rebuild --nodeps of the .src.rpm$([ "$CROSS" = 1 ] && echo ', and again --target aarch64'))"
else
  bad "make rpm"
  tail -30 "$tmp/rpm.log"
fi
took "make rpm"
srpms=$(find build/rpm/SRPMS -name '*.src.rpm' 2>/dev/null)
check "exactly one .src.rpm ($srpms)" test "$(printf '%s' "$srpms" | grep -c .)" -eq 1
want_rpms="$HOST_CPU$([ "$CROSS" = 1 ] && echo ' aarch64')"
got_rpms=$(find build/rpm/RPMS -name '*.rpm' -printf '%P\n' 2>/dev/null | LC_ALL=C sort | tr '\n' ' ')
check "one binary RPM for each of $want_rpms (got $got_rpms)" test "$got_rpms" = \
  "$(for a in $want_rpms; do echo "$a/conch-init-$VERSION-1.$a.rpm"; done | LC_ALL=C sort | tr '\n' ' ')"
check "%check ran the unit tests (Executing(%check), check-links, N passed lines)" \
  grep -q 'Executing(%check)' "$tmp/rpm.log"
if [ "$CROSS" = 1 ]; then
  check "the aarch64 %check ran the arm64 unit tests under qemu-user" grep -q '(qemu-aarch64)$' "$tmp/rpm.log"
fi
check "no unit test failed in %check" test -z "$(grep -E ' [1-9][0-9]* failed' "$tmp/rpm.log")"
if [ "$(printf '%s' "$srpms" | grep -c .)" -eq 1 ]; then
  mkdir -p "$tmp/srpm" && (cd "$tmp/srpm" && rpm2cpio "$OLDPWD/$srpms" | cpio -id --quiet)
  check "the .src.rpm holds the make dist tarball, byte for byte" cmp -s "$tmp/srpm/conch-init-$VERSION.tar.gz" "$TAR"
fi
# rpm_checks CPU: the binary RPM for CPU, its payload run natively or (aarch64
# on another CPU) under qemu-aarch64-static
rpm_checks() {
  local a=$1 r=build/rpm/RPMS/$1/conch-init-$VERSION-1.$1.rpm run=
  [ "$a" = "$HOST_CPU" ] || run=qemu-aarch64-static
  [ -f "$r" ] || return 0
  files=$(rpm -qlp "$r" 2>/dev/null)
  check "$a: rpm -qlp: /sbin/conch-init and docs only" \
    test -z "$(grep -v -e '^/sbin/conch-init$' -e "^/usr/share/doc/conch-init-$VERSION\(/\|$\)" <<<"$files")"
  check "$a: rpm -qlp lists /sbin/conch-init and README.md" \
    test "$(grep -c -e '^/sbin/conch-init$' -e "^/usr/share/doc/conch-init-$VERSION/README.md$" <<<"$files")" -eq 2
  rpmva=$(rpm -qp --qf '%{VERSION} %{ARCH}' "$r" 2>/dev/null)
  check "$a: RPM version and arch are '$VERSION $a' (got '$rpmva')" test "$rpmva" = "$VERSION $a"
  check "$a: RPM requires nothing but rpmlib features" test -z "$(rpm -qpR "$r" | grep -v '^rpmlib(')"
  dmode=$(rpm -qp --dump "$r" 2>/dev/null | awk '$1 == "/sbin/conch-init" {print $5}')
  check "$a: payload /sbin/conch-init mode is 0100755 (got $dmode)" test "$dmode" = 0100755
  mkdir -p "$tmp/rpmroot-$a" && (cd "$tmp/rpmroot-$a" && rpm2cpio "$OLDPWD/$r" | cpio -idm --quiet)
  rbin=$tmp/rpmroot-$a/sbin/conch-init
  fo=$(file -L "$rbin")
  if [ -n "$run" ]; then
    check "$a: the RPM's binary is ARM aarch64, statically linked (${fo#*: })" \
      grep -q 'ARM aarch64.*statically linked' <<<"$fo"
  else
    check "$a: the RPM's binary is statically linked" grep -q "statically linked" <<<"$fo"
  fi
  rver=$($run "$rbin" --version 2>&1)
  check "$a: the RPM's binary runs${run:+ under $run}: --version → 'conch-init $VERSION' (got '$rver')" \
    test "$rver" = "conch-init $VERSION"
}
for a in $want_rpms; do rpm_checks "$a"; done

# ---------------------------------------------------------------- make deb
arch=$(dpkg --print-architecture)
DEB=build/conch-init_${VERSION}_$arch.deb
DEB_ARM64=build/conch-init_${VERSION}_arm64.deb
rm -f "$DEB" "$DEB_ARM64"
if $MAKE deb >"$tmp/deb.log" 2>&1 && [ -f "$DEB" ]; then
  ok "make deb builds $DEB"
else
  bad "make deb builds $DEB"
  tail -20 "$tmp/deb.log"
fi
check "make deb builds $DEB_ARM64 too" test -f "$DEB_ARM64"
dsha1=$(sha256sum "$DEB" 2>/dev/null | cut -d' ' -f1)
asha1=$(sha256sum "$DEB_ARM64" 2>/dev/null | cut -d' ' -f1)
rm -f "$DEB" "$DEB_ARM64" && $MAKE deb >>"$tmp/deb.log" 2>&1
dsha2=$(sha256sum "$DEB" 2>/dev/null | cut -d' ' -f1)
asha2=$(sha256sum "$DEB_ARM64" 2>/dev/null | cut -d' ' -f1)
check "two make deb runs give the same bytes (sha256 $dsha1)" test -n "$dsha1" -a "$dsha1" = "$dsha2"
check "two make deb runs give the same arm64 bytes (sha256 $asha1)" test -n "$asha1" -a "$asha1" = "$asha2"
took "make deb (twice)"
if [ -f "$DEB" ]; then
  f=$(dpkg-deb -f "$DEB" Package Version Architecture | tr '\n' ' ')
  check "control: conch-init $VERSION $arch (got '$f')" \
    test "$f" = "Package: conch-init Version: $VERSION Architecture: $arch "
  check "control names the static libraries in Built-Using" \
    grep -q 'libuv1 (= .*nghttp2 (= .*glibc (= ' <<<"$(dpkg-deb -f "$DEB" Built-Using)"
  dpkg-deb -c "$DEB" | awk '{print $6}' >"$tmp/deb.names"
  for want in ./sbin/conch-init ./usr/share/doc/conch-init/copyright ./usr/share/doc/conch-init/changelog.gz \
    ./usr/share/doc/conch-init/README.md.gz; do
    check "the deb holds $want" grep -qx "$want" "$tmp/deb.names"
  done
  check "the deb's files: /sbin/conch-init, docs and the lintian overrides only" \
    test -z "$(grep -v -e '/$' -e '^\./sbin/conch-init$' -e '^\./usr/share/doc/conch-init/' \
      -e '^\./usr/share/lintian/overrides/conch-init$' "$tmp/deb.names")"
  check "every entry is root/root" test -z "$(dpkg-deb -c "$DEB" | awk '$2 != "root/root"')"
  mkdir -p "$tmp/debx" && dpkg-deb -x "$DEB" "$tmp/debx"
  check "the deb's /sbin/conch-init is the static binary" cmp -s "$tmp/debx/sbin/conch-init" "$BIN"
  check "the deb's changelog's newest entry is $VERSION" \
    test "$(zcat "$tmp/debx/usr/share/doc/conch-init/changelog.gz" | sed -n '1s/^conch-init (\([^)]*\)).*/\1/p')" = "$VERSION"
  # lintian: errors fail (the static link's two tags are overridden, with the
  # reason, in packaging/deb/lintian-overrides); warnings are printed.
  lintian --fail-on error "$DEB" >"$tmp/lintian.out" 2>&1
  lrc=$?
  grep -v 'root privileges' "$tmp/lintian.out" | sed 's/^/     lintian: /'
  check "lintian reports no error (rc=$lrc)" test "$lrc" -eq 0 -a -z "$(grep '^E:' "$tmp/lintian.out")"
  # dpkg installs it into an empty root of its own (no dependencies, no
  # maintainer scripts) and removes it again without leftovers
  r=$tmp/debroot
  mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" && : >"$r/var/lib/dpkg/status"
  if dpkg --root="$r" --log=/dev/null --force-script-chrootless -i "$DEB" >"$tmp/dpkg.log" 2>&1; then
    ok "dpkg --root=<empty root> -i installs it"
  else
    bad "dpkg --root=<empty root> -i installs it"
    tail -10 "$tmp/dpkg.log"
  fi
  st=$(dpkg --root="$r" -s conch-init 2>/dev/null | sed -n 's/^Status: //p')
  check "dpkg -s: install ok installed (got '$st')" test "$st" = "install ok installed"
  rv=$("$r/sbin/conch-init" --version 2>&1)
  check "the installed /sbin/conch-init runs: --version → 'conch-init $VERSION' (got '$rv')" test "$rv" = "conch-init $VERSION"
  dpkg --root="$r" --log=/dev/null --force-script-chrootless --purge conch-init >>"$tmp/dpkg.log" 2>&1
  check "dpkg --purge leaves no file behind" test -z "$(cd "$r" && find . -type f -not -path './var/lib/dpkg/*')"
fi
# The arm64 deb (cross-built from build/static-arm64): the same files,
# Built-Using from the arm64 sysroot's packages, the binary run under
# qemu-user, lintian as for the native one.  (Installing it and booting it
# on arm64 is the arm64 VM test's.)
if [ "$CROSS" = 1 ] && [ -f "$DEB_ARM64" ]; then
  f=$(dpkg-deb -f "$DEB_ARM64" Package Version Architecture | tr '\n' ' ')
  check "arm64: control: conch-init $VERSION arm64 (got '$f')" \
    test "$f" = "Package: conch-init Version: $VERSION Architecture: arm64 "
  abu=$(dpkg-deb -f "$DEB_ARM64" Built-Using)
  check "arm64: control names the static libraries in Built-Using" grep -q 'libuv1 (= .*nghttp2 (= .*glibc (= ' <<<"$abu"
  sysglibc=$(zcat build/sysroot-arm64/usr/share/doc/libc6-dev/changelog.Debian.gz | sed -n '1s/^glibc (\([^)]*\)).*/\1/p')
  check "arm64: Built-Using's glibc is the arm64 sysroot's ($sysglibc)" grep -qF "glibc (= $sysglibc)" <<<"$abu"
  dpkg-deb -c "$DEB_ARM64" | awk '{print $6}' >"$tmp/deb-arm64.names"
  check "arm64: the deb holds /sbin/conch-init" grep -qx ./sbin/conch-init "$tmp/deb-arm64.names"
  check "arm64: the deb holds the same files as the $arch one" cmp -s "$tmp/deb.names" "$tmp/deb-arm64.names"
  check "arm64: every entry is root/root" test -z "$(dpkg-deb -c "$DEB_ARM64" | awk '$2 != "root/root"')"
  mkdir -p "$tmp/debx-arm64" && dpkg-deb -x "$DEB_ARM64" "$tmp/debx-arm64"
  abin=$tmp/debx-arm64/sbin/conch-init
  check "arm64: the deb's /sbin/conch-init is $BIN_ARM64" cmp -s "$abin" "$BIN_ARM64"
  fo=$(file -L "$abin")
  check "arm64: file says ARM aarch64, statically linked (${fo#*: })" grep -q 'ARM aarch64.*statically linked' <<<"$fo"
  av=$(qemu-aarch64-static "$abin" --version 2>&1)
  check "arm64: qemu-aarch64-static <deb>/sbin/conch-init --version → 'conch-init $VERSION' (got '$av')" \
    test "$av" = "conch-init $VERSION"
  lintian --fail-on error "$DEB_ARM64" >"$tmp/lintian-arm64.out" 2>&1
  lrc=$?
  grep -v 'root privileges' "$tmp/lintian-arm64.out" | sed 's/^/     lintian (arm64): /'
  check "arm64: lintian reports no error (rc=$lrc)" test "$lrc" -eq 0 -a -z "$(grep '^E:' "$tmp/lintian-arm64.out")"
  took "the arm64 deb's checks"
fi
# Into a mmdebstrap rootfs (docs/guide/building.md's recipe; Debian's mirror, ~40 s):
# dpkg -i inside the chroot, where the binary must run.
if [ -f "$DEB" ]; then
  deb_abs=$(pwd)/$DEB
  if mmdebstrap --quiet --variant=essential --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' \
    --customize-hook="copy-in $deb_abs /tmp" \
    --customize-hook="chroot \"\$1\" dpkg -i /tmp/$(basename "$DEB")" \
    --customize-hook='chroot "$1" /sbin/conch-init --version > "$1/tmp/version"' \
    --customize-hook="copy-out /tmp/version /sbin/conch-init /var/lib/dpkg/status $tmp" \
    bookworm /dev/null >"$tmp/mmdebstrap.log" 2>&1; then
    ok "mmdebstrap --variant=essential bookworm + dpkg -i the deb in its chroot"
  else
    bad "mmdebstrap --variant=essential bookworm + dpkg -i the deb in its chroot"
    tail -20 "$tmp/mmdebstrap.log"
  fi
  check "in that rootfs /sbin/conch-init --version → 'conch-init $VERSION' (got '$(cat "$tmp/version" 2>/dev/null)')" \
    test "$(cat "$tmp/version" 2>/dev/null)" = "conch-init $VERSION"
  check "in that rootfs /sbin/conch-init is the static binary" cmp -s "$tmp/conch-init" "$BIN"
  check "in that rootfs dpkg says conch-init $VERSION is installed" \
    test "$(sed -n '/^Package: conch-init$/,/^$/{/^Status:/p;/^Version:/p}' "$tmp/status" 2>/dev/null | tr '\n' ' ')" = \
      "Status: install ok installed Version: $VERSION "
  took "mmdebstrap"
fi
# The VM suite (make vm-check, after this) boots the deb's binary: make
# vm-image bakes the image from $DEB (init/image/mkimage.sh extracts its
# /sbin/conch-init) and tests/vm checks the image holds build/static's
# bytes, which the deb's binary was just checked to be.

summary
