#!/usr/bin/env bash
# mkimage.sh — bake conch-init into a bootable microVM guest (make vm-image).
#
#   [ARCH=arm64] init/image/mkimage.sh BIN OUT
#
# BIN: the static conch-init (make static), or the Debian package holding
# it (make deb: its /sbin/conch-init is what the guest boots, which is what
# make vm-image does).  OUT (e.g. build/vm) receives:
#   vmlinuz          Debian's stock cloud kernel (linux-image-cloud-amd64)
#   initramfs.cpio.gz  /init -> /sbin/conch-init, the binary, the kernel
#                    modules of MODULES with their dependencies (modules.dep
#                    made by depmod), /etc/conch/modules naming them
#   rootfs.erofs     a real Debian 12 rootfs (mmdebstrap minbase + python3,
#                    procps and sysvinit-core for ps and poweroff)
#   top.erofs        a small newer layer on top (proves layer order)
# Each erofs image is padded to a 2 MiB multiple, as virtio-pmem needs.
# Boot with: -kernel vmlinuz -initrd initramfs.cpio.gz, layers as virtio-pmem
# (newest = pmem0) or virtio-blk with conch.layers=/dev/vda,/dev/vdb.
#
# ARCH=arm64 (make vm-image-arm64) bakes the aarch64 guest from this x86-64
# machine: kernel and rootfs are Debian's arm64 packages unpacked by
# mmdebstrap --variant=extract (no maintainer scripts run, so no emulation is
# needed; the few things those scripts would do are done here), layers for
# virtio-blk (no pmem), boot with qemu-system-aarch64 -M virt.
#
# Everything is cached in OUT: the kernel by package version, the rootfs by
# its package list; the initramfs is rebuilt when BIN or MODULES change.
# Needs root (mmdebstrap, device nodes in the cpio) and Debian's apt.
set -euo pipefail
BIN=${1:?usage: mkimage.sh BIN OUT}
OUT=${2:?usage: mkimage.sh BIN OUT}
SUITE=${SUITE:-bookworm}
ARCH=${ARCH:-$(dpkg --print-architecture)}
if [ "$ARCH" = arm64 ] && [ "$(dpkg --print-architecture)" != arm64 ]; then
  FOREIGN=1
  PACKAGES=${PACKAGES:-python3,procps,dash,coreutils,base-files,base-passwd,findutils,grep,sed}
  MODULES=${MODULES:-virtio_pci virtio_blk virtio_net erofs overlay vsock vmw_vsock_virtio_transport vsock_loopback inet_diag tcp_diag}
else
  FOREIGN=
  PACKAGES=${PACKAGES:-python3,procps,sysvinit-core}
  MODULES=${MODULES:-virtio_pci virtio_blk virtio_net virtio_pmem nd_pmem erofs overlay vsock vmw_vsock_virtio_transport vsock_loopback inet_diag tcp_diag}
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { echo "mkimage: $*" >&2; }

need=()
for t in mmdebstrap:mmdebstrap mkfs.erofs:erofs-utils depmod:kmod cpio:cpio; do
  command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

pad2m() { # pad an image to a multiple of 2 MiB
  local sz; sz=$(stat -c %s "$1")
  truncate -s $(( (sz + 2097151) / 2097152 * 2097152 )) "$1"
}

# ------------------------------------------------------------ kernel
meta=linux-image-cloud-$ARCH
if [ -n "$FOREIGN" ]; then # the foreign kernel: unpacked with its dependencies, /boot and modules kept
  kdir=$(ls -d "$OUT"/kernel-* 2>/dev/null | head -1 || true)
  if [ -z "$kdir" ] || [ ! -f "$kdir/.done" ]; then
    log "fetching $meta ($ARCH)"
    rm -rf "$OUT"/kernel-* "$OUT/kx"
    mmdebstrap --quiet --variant=extract --arch="$ARCH" --include="$meta" "$SUITE" "$OUT/kx"
    kver=$(ls "$OUT/kx/boot" | sed -n 's/^vmlinuz-//p' | head -1)
    [ -n "$kver" ] || { log "no vmlinuz in $meta"; exit 1; }
    kdir=$OUT/kernel-$kver
    mkdir -p "$kdir/root/lib/modules" "$kdir/root/boot"
    mv "$OUT/kx/boot/vmlinuz-$kver" "$kdir/root/boot/"
    mv "$OUT/kx/lib/modules/$kver" "$kdir/root/lib/modules/"
    rm -rf "$OUT/kx"
    depmod -b "$kdir/root" "$kver"
    touch "$kdir/.done"
  fi
  kver=${kdir##*/kernel-}
fi
kpkg() { apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true; }
[ -n "$FOREIGN" ] || kpkg=$(kpkg)
if [ -z "$FOREIGN" ] && [ -z "$kpkg" ]; then apt-get update -qq; kpkg=$(kpkg); fi
[ -n "$FOREIGN" ] || [ -n "$kpkg" ] || { log "cannot find the kernel package of $meta (apt-cache depends)"; exit 1; }
[ -n "$FOREIGN" ] || { kver=${kpkg#linux-image-}; kdir=$OUT/kernel-$kver; }
if [ -z "$FOREIGN" ] && [ ! -f "$kdir/.done" ]; then
  log "fetching $kpkg"
  rm -rf "$kdir" && mkdir -p "$kdir/dl"
  (cd "$kdir/dl" && apt-get download "$kpkg" 2>&1 | grep -v unsandboxed >&2 || true)
  dpkg-deb -x "$kdir"/dl/*.deb "$kdir/root"
  rm -rf "$kdir/dl"
  depmod -b "$kdir/root" "$kver"
  touch "$kdir/.done"
fi
cp "$kdir/root/boot/vmlinuz-$kver" "$OUT/vmlinuz.tmp" && mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"

# ------------------------------------------------------------ initramfs
# The dependency closure of MODULES, from modules.dep ("path: dep dep …").
moddir=$kdir/root/lib/modules/$kver
resolve() { # fails naming the MODULES that are neither modules nor built in
  awk -v want="$MODULES" '
    function base(p) { sub(/.*\//, "", p); sub(/\.ko(\.[a-z]+)?$/, "", p); gsub(/-/, "_", p); return p }
    BEGIN { n = split(want, w, " ") }
    FNR == NR { builtin[base($1)] = 1; next }
    { k = $1; sub(/:$/, "", k); path[base(k)] = k; deps[base(k)] = ""
      for (i = 2; i <= NF; i++) deps[base(k)] = deps[base(k)] " " $i }
    function add(m,   d, i, nd) {
      if (m in seen) return; seen[m] = 1
      if (!(m in path)) return
      print path[m]
      nd = split(deps[m], d, " "); for (i = 1; i <= nd; i++) add(base(d[i]))
    }
    END { bad = 0
          for (i = 1; i <= n; i++) { m = w[i]; gsub(/-/, "_", m)
            if (!(m in path) && !(m in builtin)) { print "mkimage: unknown module " w[i] > "/dev/stderr"; bad = 1 }
            add(m) }
          exit bad }' "$moddir/modules.builtin" "$moddir/modules.dep"
}
stamp=$( { sha256sum "$BIN"; echo "$MODULES $kver"; sha256sum "$0"; } | sha256sum | cut -c1-16)
if [ ! -f "$OUT/initramfs.cpio.gz" ] || [ "$(cat "$OUT/.initramfs.stamp" 2>/dev/null)" != "$stamp" ]; then
  log "initramfs ($kver)"
  ir=$OUT/initramfs.d
  rm -rf "$ir" && mkdir -p "$ir"/{sbin,etc/conch,dev,proc,sys,lib/modules/"$kver"}
  case $BIN in
    *.deb) dpkg-deb --fsys-tarfile "$BIN" | tar -x -C "$ir" ./sbin/conch-init ;;
    *) install -m 0755 "$BIN" "$ir/sbin/conch-init" ;;
  esac
  ln -s /sbin/conch-init "$ir/init"
  files=$(resolve) || exit 1
  for f in $files; do
    mkdir -p "$ir/lib/modules/$kver/$(dirname "$f")"
    cp "$moddir/$f" "$ir/lib/modules/$kver/$f"
  done
  for m in $MODULES; do echo "$m"; done > "$ir/etc/conch/modules"
  cp "$moddir"/modules.{order,builtin,builtin.modinfo} "$ir/lib/modules/$kver/"
  depmod -b "$ir" "$kver"
  mknod -m 600 "$ir/dev/console" c 5 1
  (cd "$ir" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) | gzip -9 > "$OUT/initramfs.cpio.gz.tmp"
  mv "$OUT/initramfs.cpio.gz.tmp" "$OUT/initramfs.cpio.gz"
  echo "$stamp" > "$OUT/.initramfs.stamp"
  sha256sum < "$ir/sbin/conch-init" | cut -d' ' -f1 > "$OUT/conch-init.sha256" # the binary inside (tests check it)
  rm -rf "$ir"
fi

# ------------------------------------------------------------ layers
rstamp="$SUITE $ARCH $PACKAGES v1"
if [ ! -f "$OUT/rootfs.erofs" ] || [ "$(cat "$OUT/.rootfs.stamp" 2>/dev/null)" != "$rstamp" ]; then
  rd=$OUT/rootfs.d
  rm -rf "$rd"
  if [ -n "$FOREIGN" ]; then
    log "rootfs: mmdebstrap --variant=extract --arch=$ARCH $SUITE + $PACKAGES"
    mmdebstrap --quiet --variant=extract --arch="$ARCH" --include="$PACKAGES" "$SUITE" "$rd"
    # what the maintainer scripts would have done, as far as commands need it
    cp "$rd/usr/share/base-passwd/passwd.master" "$rd/etc/passwd"
    cp "$rd/usr/share/base-passwd/group.master" "$rd/etc/group"
    ln -sfn dash "$rd/bin/sh"
    rm -rf "$rd"/usr/share/{doc,man,locale}
  else
    log "rootfs: mmdebstrap --variant=minbase $SUITE + $PACKAGES (a few minutes)"
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
      --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' "$SUITE" "$rd"
  fi
  rm -rf "$rd"/var/cache/apt/* "$rd"/var/lib/apt/lists/*
  echo base > "$rd/etc/conch-layer"
  mkfs.erofs --quiet "$OUT/rootfs.erofs.tmp" "$rd"
  pad2m "$OUT/rootfs.erofs.tmp"
  mv "$OUT/rootfs.erofs.tmp" "$OUT/rootfs.erofs"
  echo "$rstamp" > "$OUT/.rootfs.stamp"
  rm -rf "$rd"
fi
tstamp="top v1"
if [ ! -f "$OUT/top.erofs" ] || [ "$(cat "$OUT/.top.stamp" 2>/dev/null)" != "$tstamp" ]; then
  td=$OUT/top.d
  rm -rf "$td" && mkdir -p "$td/etc"
  echo top > "$td/etc/conch-layer"
  echo "layer order: pmem0 / the first conch.layers device is the newest" > "$td/etc/conch-top"
  mkfs.erofs --quiet "$OUT/top.erofs.tmp" "$td"
  pad2m "$OUT/top.erofs.tmp"
  mv "$OUT/top.erofs.tmp" "$OUT/top.erofs"
  echo "$tstamp" > "$OUT/.top.stamp"
  rm -rf "$td"
fi
log "ready in $OUT: vmlinuz initramfs.cpio.gz rootfs.erofs top.erofs ($kver)"
