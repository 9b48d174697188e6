#!/usr/bin/env bash
# mkdeb.sh — the Debian package of the static binary (make deb), with dpkg-deb.
#
#   packaging/deb/mkdeb.sh BIN VERSION ARCH OUTDIR [SYSROOT]
#
# → OUTDIR/conch-init_VERSION_ARCH.deb: /sbin/conch-init (BIN), and in
# /usr/share/doc/conch-init: copyright, changelog.gz (a native package:
# the version has no Debian revision), README.md.gz and the user guide.
# Built-Using names the source packages of the static libraries in BIN, as
# Debian policy asks of statically linked binaries; the lintian tags of the
# static link are overridden, with the reason, in packaging/deb/lintian-overrides.
# SYSROOT: BIN was cross-built against the -dev packages unpacked there (the
# Makefile's arm64 sysroot, mmdebstrap --variant=extract, which leaves no
# dpkg database): Built-Using is then read from their changelog.Debian.gz,
# whose first line is the source package and its version (a binNMU's entry
# is in changelog.Debian.<arch>.gz).  Reproducible: every
# file gets SOURCE_DATE_EPOCH (default: the last commit's time), owner
# root, gzip -n.
set -euo pipefail
BIN=${1:?usage: mkdeb.sh BIN VERSION ARCH OUTDIR}
VERSION=${2:?usage: mkdeb.sh BIN VERSION ARCH OUTDIR}
ARCH=${3:?usage: mkdeb.sh BIN VERSION ARCH OUTDIR}
OUT=${4:?usage: mkdeb.sh BIN VERSION ARCH OUTDIR}
SYSROOT=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
: "${SOURCE_DATE_EPOCH:=$(git -C "$top" log -1 --format=%ct 2>/dev/null || stat -c %Y "$here/changelog")}"
export SOURCE_DATE_EPOCH

# the changelog's newest entry must be this version (one place: the Makefile)
clv=$(sed -n '1s/^conch-init (\([^)]*\)).*/\1/p' "$here/changelog")
if [ "$clv" != "$VERSION" ]; then
  echo "mkdeb: packaging/deb/changelog's newest entry is '$clv', the Makefile says $VERSION: add an entry" >&2
  exit 1
fi

root=$OUT/deb-$ARCH.d
rm -rf "$root"
doc=$root/usr/share/doc/conch-init
mkdir -p "$root/DEBIAN" "$root/sbin" "$doc/guide" "$root/usr/share/lintian/overrides"
install -m 0755 "$BIN" "$root/sbin/conch-init"
install -m 0644 "$here/copyright" "$doc/copyright"
# the static link is the point of the package (lintian-overrides says why)
install -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/conch-init"
gzip -n -9 -c "$here/changelog" > "$doc/changelog.gz"
gzip -n -9 -c "$top/README.md" > "$doc/README.md.gz"
for f in "$top"/docs/guide/*.md; do gzip -n -9 -c "$f" > "$doc/guide/$(basename "$f").gz"; done

# Built-Using: the source package (= version) of each static library's -dev
# package, for the architecture built for.
bu=
for p in libuv1-dev libnghttp2-dev libprotobuf-c-dev libb64-dev libhttp-parser-dev zlib1g-dev libc6-dev; do
  if [ -n "$SYSROOT" ]; then
    cl=$SYSROOT/usr/share/doc/$p/changelog.Debian.gz
    s=$(zcat "$cl" 2>/dev/null | sed -n '1s/^\([a-z0-9][a-z0-9+.-]*\) (\([^)]*\)).*/\1 (= \2)/p')
    [ -n "$s" ] || { echo "mkdeb: no source version for $p in $cl" >&2; exit 1; }
  elif [ "$ARCH" = "$(dpkg --print-architecture)" ]; then
    s=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' "$p:$ARCH" 2>/dev/null ||
        dpkg-query -W -f='${source:Package} (= ${source:Version})' "$p")
  else
    s=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' "$p:$ARCH") ||
      { echo "mkdeb: $p:$ARCH is not installed: give the SYSROOT BIN was built against" >&2; exit 1; }
  fi
  bu=${bu:+$bu, }$s
done
cat > "$root/DEBIAN/control" <<EOF
Package: conch-init
Version: $VERSION
Architecture: $ARCH
Maintainer: conch-init developers <conch-init@example.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Section: admin
Priority: optional
Built-Using: $bu
Description: PID 1 and agent API server of Conch sandbox microVMs
 conch-init runs as PID 1 inside every Conch sandbox microVM: it boots the
 guest, takes the host's init message over virtio-vsock, chroots into the
 sandbox root and serves the agent API (Connect RPC over HTTP/1.1 and h2c
 on TCP :4064) for running processes and moving files.
 .
 The binary is statically linked: it needs nothing else in the image.
EOF
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | LC_ALL=C sort | sed 's|^\./||' |
  xargs md5sum > DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$OUT/conch-init_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
rm -rf "$root"
echo "$deb"
