# conch-init — build, test, package.
#
#   make            development binary            build/dev/conch-init
#   make asan       ASan+UBSan binary (tests)     build/asan/conch-init
#   make static     static release binary         build/static/conch-init
#   make static-arm64  the same, cross-built for aarch64   build/static-arm64/conch-init
#   make unit-arm64 the unit tests cross-built for aarch64, run under qemu-aarch64-static
#   make run        build and serve on 127.0.0.1:4064 in standalone mode (prints a token);
#                   RUN_LISTEN=HOST:PORT serves elsewhere (0.0.0.0:4064: every interface)
#   make check      build and run every test (unit, integration, namespaces, microVM)
#   make vm-image   bake the static binary (from the .deb) into a bootable guest (build/vm)
#   make unit       unit tests only
#   make soak       the soak (tests/soak): [SOAK_SECONDS=600] [SOAK_SEED=n], ASan binary
#   make install    [PREFIX=/usr/local] [DESTDIR=…] → $(DESTDIR)$(PREFIX)/sbin/conch-init
#   make dist       reproducible source tarball   build/conch-init-$(VERSION).tar.gz
#   make rpm        .src.rpm and the x86_64 and aarch64 RPMs rebuilt from it (build/rpm)
#   make deb        Debian packages of the static binaries   build/conch-init_$(VERSION)_{amd64,arm64}.deb
#
# Missing Debian build dependencies are installed automatically when run as
# root (see the `deps` target); set CONCH_NO_APT=1 to skip that.

VERSION   := 0.1.0
# The Debian packages (make deb), named here: rules above their recipe use them.
DEB_ARCH  := $(shell dpkg --print-architecture 2>/dev/null)
DEB       := build/conch-init_$(VERSION)_$(DEB_ARCH).deb
DEB_ARM64 := build/conch-init_$(VERSION)_arm64.deb
# install: $(DESTDIR)$(PREFIX)/sbin/conch-init — by default /sbin/conch-init
PREFIX    ?=
DESTDIR   ?=
SBINDIR   ?= $(PREFIX)/sbin

CC        ?= cc
PROTOC_C  ?= protoc-c

BUILD_DEPS := gcc make pkg-config libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler \
              libuv1-dev libb64-dev libhttp-parser-dev zlib1g-dev
TEST_DEPS  := curl protobuf-compiler python3-h2 python3-grpcio python3-protobuf python3-pytest python3 \
              nghttp2-client nghttp2-server iproute2 erofs-utils util-linux rpm e2fsprogs bc \
              qemu-system-x86 mmdebstrap cpio kmod busybox-static wget chromium nginx-core openssl prometheus strace
# make check's package checks (tests/packaging.sh): rpmbuild, rpm2cpio, lintian, file
PKG_DEPS   := rpm rpm2cpio cpio lintian file

SRC_DIRS  := core server init agent proto fs proc reflect net
REFLECT_PROTOS := proto/agent.proto proto/reflection.proto proto/reflection_v1alpha.proto
LIB_SRCS  := $(filter-out agent/main.c,$(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c)))
UNIT_SRCS := $(wildcard tests/unit/test_*.c)

WARN      := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers \
             -Wshadow -Wformat=2 -Wvla
BASEFLAGS := -std=gnu11 -D_GNU_SOURCE -DCONCH_VERSION='"$(VERSION)"' -I. $(WARN) -MMD -MP
LIBS      := -lnghttp2 -luv -lprotobuf-c -lb64 -lhttp_parser -lz -lpthread -ldl -lrt
STATIC_LIBS := -Wl,-Bstatic -lnghttp2 -luv_a -lprotobuf-c -lb64 -lhttp_parser -lz -lpthread -ldl -lrt

dev_CFLAGS    := -O2 -g
asan_CFLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
# NDEBUG: an internal assert() (callstate.c) logs instead of aborting PID 1
static_CFLAGS := -O2 -DCONCH_STATIC -DNDEBUG
# The same source under another version string: the program an upgrade in
# place goes to in the VM test (tests/vm/test_upgrade.py)
static-next_CFLAGS := $(static_CFLAGS) -UCONCH_VERSION -DCONCH_VERSION='"$(VERSION)-next"'
# ThreadSanitizer: the thread pool and its unit tests (make tsan-check)
tsan_CFLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
# libFuzzer drivers (tests/fuzz): the library built by clang with coverage
fuzz_CC       := clang
fuzz_CFLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
                 -fno-sanitize-recover=undefined -Wno-deprecated-declarations

# arm64 (aarch64): Debian's cross gcc against a sysroot of Debian's arm64
# -dev packages, unpacked by mmdebstrap --variant=extract (no maintainer
# scripts run, so no binfmt or emulation is needed to make it, and the host's
# dpkg architectures stay as they are).  qemu-user runs its unit tests.
ARM64_DEPS    := gcc-aarch64-linux-gnu qemu-user-static mmdebstrap
ARM64_SYSROOT := build/sysroot-arm64
ARM64_PKGS    := libc6-dev,libuv1-dev,libnghttp2-dev,libprotobuf-c-dev,libb64-dev,zlib1g-dev,libhttp-parser-dev
ARM64_STAMP   := $(ARM64_SYSROOT)/.done
# (ARM64_SYSROOT may be given, relative or absolute: the RPM's aarch64
# rebuild points it at this tree's sysroot rather than unpack another one)
static-arm64_CC     := aarch64-linux-gnu-gcc --sysroot=$(abspath $(ARM64_SYSROOT))
static-arm64_CFLAGS := $(static_CFLAGS)
static-arm64_AR     := aarch64-linux-gnu-ar

# quiet by default; make V=1 shows the commands
ifeq ($(V),1)
Q :=
else
Q := @
endif

.PHONY: all dev asan static static-arm64 unit-arm64 vm-image-arm64 run check unit integration packaging install rpm dist deb pkg-deps clean deps test-deps bench \
        vm-image vm-check fuzz fuzz-build fuzz-smoke tsan-check
all: dev

# ---------------------------------------------------------------- deps
# $(call apt-missing,WHAT,PACKAGES[,SNIPPET]): a recipe line installing those
# of PACKAGES that dpkg does not have (as root; CONCH_NO_APT=1 or not root:
# only names them and fails); SNIPPET is shell that may add to $$missing.
apt-missing = missing=$$(for p in $(2); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); $(3) \
  if [ -n "$$missing" ]; then \
    if [ "$$(id -u)" = 0 ] && [ -z "$(CONCH_NO_APT)" ]; then echo "installing $(1): $$missing"; \
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
    else echo "missing $(1): $$missing (run as root, or apt-get install them)"; exit 1; fi; \
  fi

DEPS_STAMP := build/.deps-ok
$(DEPS_STAMP):
	@mkdir -p build
	@$(call apt-missing,build dependencies,$(BUILD_DEPS))
	@touch $@
deps: $(DEPS_STAMP)

test-deps: $(DEPS_STAMP)
	@$(call apt-missing,test dependencies,$(TEST_DEPS),command -v node >/dev/null || missing="$$missing nodejs"; command -v npm >/dev/null || missing="$$missing npm";)
	@if [ -f tests/node/package.json ] && [ ! -d tests/node/node_modules/@connectrpc/connect-node ]; then \
	  cd tests/node && npm install --no-audit --no-fund --loglevel=error; fi
	@if [ ! -x tests/buf/node_modules/.bin/buf ]; then \
	  cd tests/buf && npm install --no-audit --no-fund --loglevel=error; fi

# ---------------------------------------------------------------- build
# One set of rules per variant (dev, asan, static).
define VARIANT
build/$(1)/gen/proto/agent.pb-c.c build/$(1)/gen/proto/agent.pb-c.h: proto/agent.proto | $(DEPS_STAMP)
	@mkdir -p build/$(1)/gen
	$(PROTOC_C) --c_out=build/$(1)/gen -I. proto/agent.proto

build/$(1)/gen/proto/reflection.pb-c.c build/$(1)/gen/proto/reflection.pb-c.h: proto/reflection.proto | $(DEPS_STAMP)
	@mkdir -p build/$(1)/gen
	$(PROTOC_C) --c_out=build/$(1)/gen -I. proto/reflection.proto

# the state an upgrade in place carries (core/handover.h, agent/parts.c); never on the wire
build/$(1)/gen/proto/handover.pb-c.c build/$(1)/gen/proto/handover.pb-c.h: proto/handover.proto | $(DEPS_STAMP)
	@mkdir -p build/$(1)/gen
	$(PROTOC_C) --c_out=build/$(1)/gen -I. proto/handover.proto

# The descriptors served by gRPC reflection (reflect/), embedded as a C array.
build/$(1)/gen/proto/descriptors.c: $(REFLECT_PROTOS) | $(DEPS_STAMP)
	@mkdir -p build/$(1)/gen/proto
	$(PROTOC_C) --descriptor_set_out=build/$(1)/gen/proto/descriptors.pb --include_imports -Iproto $(notdir $(REFLECT_PROTOS))
	$(Q){ echo '/* generated from build/$(1)/gen/proto/descriptors.pb (Makefile) */'; \
	  echo '#include <stddef.h>'; \
	  echo 'const unsigned char reflect_descriptor_set[] = {'; \
	  od -An -v -tx1 build/$(1)/gen/proto/descriptors.pb | sed -e 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '};'; \
	  echo 'const size_t reflect_descriptor_set_len = sizeof reflect_descriptor_set;'; } > $$@.tmp && mv $$@.tmp $$@

$(1)_GEN_OBJS := build/$(1)/obj/gen/agent.pb-c.o build/$(1)/obj/gen/reflection.pb-c.o build/$(1)/obj/gen/handover.pb-c.o build/$(1)/obj/gen/descriptors.o
$(1)_OBJS := $(patsubst %.c,build/$(1)/obj/%.o,$(LIB_SRCS)) $$($(1)_GEN_OBJS)

build/$(1)/obj/%.o: %.c build/$(1)/gen/proto/agent.pb-c.h build/$(1)/gen/proto/reflection.pb-c.h build/$(1)/gen/proto/handover.pb-c.h | $(DEPS_STAMP)
	@mkdir -p $$(dir $$@)
	@$(if $(Q),echo "  CC [$(1)] $$<")
	$(Q)$(or $($(1)_CC),$(CC)) $(BASEFLAGS) -Ibuild/$(1)/gen $($(1)_CFLAGS) $(CFLAGS) -c $$< -o $$@

build/$(1)/obj/gen/%.o: build/$(1)/gen/proto/%.c
	@mkdir -p $$(dir $$@)
	$(Q)$(or $($(1)_CC),$(CC)) -std=gnu11 -I. -Ibuild/$(1)/gen $($(1)_CFLAGS) $(CFLAGS) -c $$< -o $$@

build/$(1)/libconch.a: $$($(1)_OBJS)
	@rm -f $$@
	$(Q)$(or $($(1)_AR),ar) rcs $$@ $$^

-include $$(patsubst %.o,%.d,$$($(1)_OBJS))
endef
$(foreach v,dev asan static static-next fuzz tsan static-arm64,$(eval $(call VARIANT,$(v))))

$(ARM64_STAMP): | $(DEPS_STAMP)
	@$(call apt-missing,arm64 cross dependencies,$(ARM64_DEPS))
	@echo "  SYSROOT arm64 ($(ARM64_PKGS))"
	$(Q)rm -rf $(ARM64_SYSROOT) && mmdebstrap --quiet --variant=extract --arch=arm64 \
	  --include=$(ARM64_PKGS) bookworm $(ARM64_SYSROOT)
	@touch $@
$(static-arm64_OBJS) build/static-arm64/obj/agent/main.o build/static-arm64/gen/proto/agent.pb-c.c: | $(ARM64_STAMP)

# clang (libFuzzer) only for the fuzz variant: `make run` does not need it
FUZZ_DEPS := clang libclang-rt-14-dev
FUZZ_DEPS_STAMP := build/.fuzzdeps-ok
$(FUZZ_DEPS_STAMP): | $(DEPS_STAMP)
	@$(call apt-missing,fuzzing dependencies,$(FUZZ_DEPS))
	@touch $@
$(fuzz_OBJS) build/fuzz/gen/proto/agent.pb-c.c: | $(FUZZ_DEPS_STAMP)

build/dev/conch-init: build/dev/obj/agent/main.o build/dev/libconch.a
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(dev_CFLAGS) $^ $(LIBS) -o $@
build/asan/conch-init: build/asan/obj/agent/main.o build/asan/libconch.a
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(asan_CFLAGS) $^ $(LIBS) -o $@
build/static/conch-init: build/static/obj/agent/main.o build/static/libconch.a
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) -static $(static_CFLAGS) $^ $(STATIC_LIBS) -o $@
	strip $@

build/static-next/conch-init: build/static-next/obj/agent/main.o build/static-next/libconch.a
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) -static $(static-next_CFLAGS) $^ $(STATIC_LIBS) -o $@
	strip $@

dev: build/dev/conch-init
asan: build/asan/conch-init
static: build/static/conch-init
build/static-arm64/conch-init: build/static-arm64/obj/agent/main.o build/static-arm64/libconch.a
	@$(if $(Q),echo "  LD $@")
	$(Q)$(static-arm64_CC) -static $(static_CFLAGS) $^ $(STATIC_LIBS) -o $@
	aarch64-linux-gnu-strip $@
static-arm64: build/static-arm64/conch-init

# ---------------------------------------------------------------- tests
UNIT_BINS := $(patsubst tests/unit/%.c,build/asan/tests/%,$(UNIT_SRCS))
build/asan/tests/%: tests/unit/%.c build/asan/libconch.a tests/unit/test.h tests/unit/memsink.h tests/unit/h2client.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(BASEFLAGS) -Ibuild/asan/gen $(asan_CFLAGS) $< build/asan/libconch.a $(LIBS) -o $@

# failmalloc interposes malloc: built without ASan, on the dev library
build/dev/tests/failmalloc: tests/unit/failmalloc.c build/dev/libconch.a tests/unit/test.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(BASEFLAGS) -Ibuild/dev/gen $(dev_CFLAGS) $< build/dev/libconch.a $(LIBS) -o $@

unit: $(UNIT_BINS) build/dev/tests/failmalloc
	@fail=0; tests/tools/check-layers.sh build/asan/obj || fail=1; tests/tools/test-check-layers.sh build/asan/obj || fail=1; tests/tools/check-links.sh || fail=1; tests/tools/check-sizes.sh || fail=1; echo "== include cycles"; for d in core server agent; do /usr/bin/python3 tests/tools/include-cycles.py $$d || fail=1; done; echo "== api doc"; /usr/bin/python3 tests/tools/check-api-doc.py || fail=1; tests/tools/test-check-api-doc.sh || fail=1; \
	for t in $^; do echo "== $$t"; $$t || fail=1; done; exit $$fail

# The unit tests cross-built for arm64 (static, without the sanitizers, whose
# runtimes qemu-user does not carry) and run under qemu-aarch64-static.
# failmalloc (it interposes malloc in a dynamic binary) stays x86-64 only.
# ARM64_GUEST_TESTS test what qemu-user 7.2 does not emulate (it refuses
# PR_SET_CHILD_SUBREAPER, its own signal dispositions leak into a child's
# SigIgn, statx gives mount ID 0, its /proc and netlink sock_diag are not the
# guest's): they are built here and run inside the
# arm64 VM instead
# (tests/vm/test_arm64.py), on a real arm64 kernel.
ARM64_GUEST_TESTS := test_proc_reaper test_proc_spawn test_fs_tree test_net_scan test_net_steer
ARM64_ALL_UNIT_BINS := $(patsubst tests/unit/%.c,build/static-arm64/tests/%,$(UNIT_SRCS))
ARM64_UNIT_BINS := $(filter-out $(addprefix build/static-arm64/tests/,$(ARM64_GUEST_TESTS)),$(ARM64_ALL_UNIT_BINS))
build/static-arm64/tests/%: tests/unit/%.c build/static-arm64/libconch.a tests/unit/test.h tests/unit/memsink.h tests/unit/h2client.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD [arm64] $@")
	$(Q)$(static-arm64_CC) -static $(BASEFLAGS) -Ibuild/static-arm64/gen -O1 -g $< build/static-arm64/libconch.a $(STATIC_LIBS) -o $@
unit-arm64: $(ARM64_ALL_UNIT_BINS)
	@fail=0; for t in $(ARM64_UNIT_BINS); do echo "== $$t (qemu-aarch64)"; qemu-aarch64-static $$t || fail=1; done; \
	echo "== $(ARM64_GUEST_TESTS): built, run in the arm64 VM (tests/vm/test_arm64.py)"; exit $$fail

integration: asan test-deps
	tests/run-integration.sh

PKG_DEPS_STAMP := build/.pkgdeps-ok
$(PKG_DEPS_STAMP): | $(DEPS_STAMP)
	@$(call apt-missing,packaging dependencies,$(PKG_DEPS))
	@touch $@
pkg-deps: $(PKG_DEPS_STAMP)

packaging: deps pkg-deps $(ARM64_STAMP)
	tests/packaging.sh

# The pool's tests under ThreadSanitizer (its worker threads and the loop).
TSAN_TESTS := test_pool test_pool_nofd
build/tsan/tests/%: tests/unit/%.c build/tsan/libconch.a tests/unit/test.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)$(CC) $(BASEFLAGS) -Ibuild/tsan/gen $(tsan_CFLAGS) $< build/tsan/libconch.a $(LIBS) -o $@
tsan-check: $(addprefix build/tsan/tests/,$(TSAN_TESTS))
	@fail=0; for t in $^; do echo "== $$t (tsan)"; TSAN_OPTIONS=halt_on_error=1 $$t || fail=1; done; exit $$fail

# Fuzzing (tests/fuzz): make fuzz [FUZZ_SECONDS=60] runs every driver for
# that long on its checked-in corpus plus build/fuzz/corpus; make check runs
# each for FUZZ_SMOKE_SECONDS with a fixed seed (tests/fuzz/run.sh).
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,build/fuzz/bin/%,$(FUZZ_SRCS))
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 20
build/fuzz/bin/%: tests/fuzz/%.c build/fuzz/libconch.a tests/fuzz/fuzz.h tests/fuzz/fuzz_msgs.h tests/unit/memsink.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD $@")
	$(Q)clang $(BASEFLAGS) -Ibuild/fuzz/gen $(fuzz_CFLAGS) -fsanitize=fuzzer $< build/fuzz/libconch.a $(LIBS) -o $@
fuzz-build: $(FUZZ_BINS)
fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_BINS)
fuzz-smoke: fuzz-build
	FUZZ_SEED=1 tests/fuzz/run.sh $(FUZZ_SMOKE_SECONDS) $(FUZZ_BINS)

# The soak (tests/soak, docs/guide/tests.md "Soak"): clients at once with
# faults against the ASan binary, then the invariants checked on what they
# saw.  make soak [SOAK_SECONDS=600] [SOAK_SEED=n] [SOAK_CLIENTS=8]
# [SOAK_UPGRADE_EVERY=10: upgrade the agent in place that often];
# make check runs soak-check: the harness's own test (four broken agents
# built from build/dev, each caught by its invariant), a 60 s soak and a
# 45 s one with an upgrade in place every 10 s.
SOAK_SECONDS ?= 600
SOAK_CHECK_SECONDS ?= 60
SOAK_CHECK_UPGRADE_SECONDS ?= 45
SOAK_DEPS := python3 python3-h2 python3-protobuf python3-pytest protobuf-compiler patch
SOAK_DEPS_STAMP := build/.soakdeps-ok
SOAK_ARGS = $(if $(SOAK_SEED),--seed $(SOAK_SEED)) $(if $(SOAK_CLIENTS),--clients $(SOAK_CLIENTS))
SOAK_UPGRADE_ARGS = $(if $(SOAK_UPGRADE_EVERY),--upgrade-every $(SOAK_UPGRADE_EVERY))
.PHONY: soak soak-check
$(SOAK_DEPS_STAMP): | $(DEPS_STAMP)
	@$(call apt-missing,soak dependencies,$(SOAK_DEPS))
	@touch $@
soak: asan $(SOAK_DEPS_STAMP)
	nice -n 10 /usr/bin/python3 tests/soak/soak.py --seconds $(SOAK_SECONDS) $(SOAK_ARGS) $(SOAK_UPGRADE_ARGS)
soak-check: asan dev $(SOAK_DEPS_STAMP)
	/usr/bin/python3 -m pytest -q -p no:cacheprovider tests/soak/test_harness.py
	/usr/bin/python3 tests/soak/soak.py --seconds $(SOAK_CHECK_SECONDS) --upgrade-every 0 $(SOAK_ARGS)
	/usr/bin/python3 tests/soak/soak.py --seconds $(SOAK_CHECK_UPGRADE_SECONDS) --upgrade-every 10 $(SOAK_ARGS)

# The microVM suite (tests/vm): Debian's stock kernel under qemu, booting
# the image of vm-image.  Runs alone: TCG wants both cores.
vm-image: static $(DEB)
	init/image/mkimage.sh $(DEB) build/vm

# The arm64 guest (tests/vm/test_arm64.py): Debian's arm64 kernel and
# packages unpacked here, booted under qemu-system-aarch64 (TCG); its
# conch-init is the arm64 .deb's, as x86-64's is the amd64 .deb's.
VM_ARM64_DEPS := qemu-system-arm
vm-image-arm64: static-arm64 $(DEB_ARM64)
	@$(call apt-missing,arm64 VM dependencies,$(VM_ARM64_DEPS))
	ARCH=arm64 init/image/mkimage.sh $(DEB_ARM64) build/vm-arm64

vm-check: vm-image vm-image-arm64 build/static-next/conch-init $(ARM64_ALL_UNIT_BINS) test-deps
	@mkdir -p build/py && protoc --python_out=build/py -Iproto proto/agent.proto
	PYTHONPATH=$(CURDIR)/build/py:$(CURDIR)/tests/integration /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/vm

check: asan unit unit-arm64 tsan-check fuzz-smoke integration soak-check packaging vm-check

# The token goes to the daemon in a file (mode 0600), not on its command
# line, where /proc/<pid>/cmdline would show it until it overwrites it.
# Loopback only by default: the API runs commands as root, so it is reached
# from other machines only when asked (RUN_LISTEN=0.0.0.0:4064).
RUN_LISTEN ?= 127.0.0.1:4064
run: dev
	@tok=$${CONCH_INIT_TOKEN:-$$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}; \
	tf=build/run-token; rm -f $$tf; (umask 077; printf '%s\n' "$$tok" > $$tf) || exit 1; \
	echo "conch-init serving on $(RUN_LISTEN)  token: $$tok  (in $$tf)"; \
	echo "  try: curl -s http://127.0.0.1:4064/health"; \
	echo "       curl -s http://127.0.0.1:4064/pb.ProcessService/List -H 'Connect-Protocol-Version: 1' -H 'Content-Type: application/json' -H \"conch-init-token: $$tok\" --data '{}'"; \
	exec build/dev/conch-init serve --listen '$(RUN_LISTEN)' --token-file $$tf

bench: dev test-deps
	tests/bench/run-all.sh

# ---------------------------------------------------------------- install & package
install: static
	install -D -m 0755 build/static/conch-init $(DESTDIR)$(SBINDIR)/conch-init

# The source tarball: every tracked file but the fuzz corpora (only the fuzz
# campaign and its smoke read them; neither runs from a tarball) and .ci/,
# with the version written into the spec.  Reproducible: sorted names, the
# last commit's time on every entry, owner 0/0, modes without umask's say,
# gzip -n.  Tracked files are taken as they are in the work tree.
DIST     := conch-init-$(VERSION)
DIST_TAR := build/$(DIST).tar.gz
dist:
	$(Q)git rev-parse --git-dir >/dev/null 2>&1 || { echo "make dist needs a git checkout"; exit 1; }
	$(Q)rm -rf build/dist && mkdir -p build/dist/$(DIST)
	$(Q)git ls-files -z | grep -zv -e '^tests/fuzz/corpus/' -e '^\.ci/' | \
	  tar -c --null -T - -f - | tar -x -C build/dist/$(DIST) -f -
	$(Q)sed 's/@VERSION@/$(VERSION)/g' conch-init.spec > build/dist/$(DIST)/conch-init.spec
	$(Q)tar -c --format=gnu --sort=name --mtime=@$$(git log -1 --format=%ct) --owner=0 --group=0 \
	  --numeric-owner --mode='u+rw,go-w,a+rX' -C build/dist -f - $(DIST) | gzip -n -9 > $(DIST_TAR).tmp
	$(Q)mv $(DIST_TAR).tmp $(DIST_TAR) && rm -rf build/dist
	@echo "$(DIST_TAR)"

# The .src.rpm from the tarball (the spec inside it), then the binary RPMs by
# rebuilding that .src.rpm, as a packager would: --nodeps because on Debian
# the BuildRequires are Debian's -dev packages, not in rpm's database.  On
# an x86-64 machine the same .src.rpm is rebuilt a second time with
# --target aarch64: the spec then cross-builds (make static-arm64, the unit
# tests under qemu-user in %check) against this tree's arm64 sysroot.
RPM_TOP  := $(CURDIR)/build/rpm
RPM_SRPM  = build/rpm/SRPMS/conch-init-$(VERSION)-*.src.rpm
ifeq ($(shell uname -m),aarch64)
RPM_CROSS :=
else
RPM_CROSS := $(ARM64_STAMP)
endif
rpm: dist pkg-deps $(RPM_CROSS)
	$(Q)rm -rf build/rpm && mkdir -p build/rpm
	rpmbuild -ts --nodeps --define "_topdir $(RPM_TOP)" $(DIST_TAR)
	rpmbuild --rebuild --nodeps --define "_topdir $(RPM_TOP)" $(RPM_SRPM)
	$(if $(RPM_CROSS),rpmbuild --rebuild --nodeps --target aarch64 --define "_topdir $(RPM_TOP)" \
	  --define "conch_arm64_sysroot $(abspath $(ARM64_SYSROOT))" $(RPM_SRPM))
	@find build/rpm/SRPMS build/rpm/RPMS -name '*.rpm'

# The Debian packages (packaging/deb/mkdeb.sh, dpkg-deb): /sbin/conch-init,
# docs, copyright.  DEB is the build machine's architecture (build/static,
# what vm-image bakes), DEB_ARM64 the cross-built build/static-arm64 (its
# Built-Using read from the arm64 sysroot); on an arm64 machine they are one.
# (DEB_ARCH, DEB, DEB_ARM64: defined at the top, before vm-image's rules use them)
DEB_SRCS  := packaging/deb/mkdeb.sh packaging/deb/copyright packaging/deb/changelog packaging/deb/lintian-overrides README.md
deb: $(DEB) $(DEB_ARM64)
$(DEB): build/static/conch-init $(DEB_SRCS) | $(PKG_DEPS_STAMP)
	packaging/deb/mkdeb.sh build/static/conch-init $(VERSION) $(DEB_ARCH) build
ifneq ($(DEB_ARCH),arm64)
$(DEB_ARM64): build/static-arm64/conch-init $(DEB_SRCS) | $(PKG_DEPS_STAMP) $(ARM64_STAMP)
	packaging/deb/mkdeb.sh build/static-arm64/conch-init $(VERSION) arm64 build $(ARM64_SYSROOT)
endif

clean:
	rm -rf build/dev build/asan build/static build/static-arm64 build/fuzz/obj build/fuzz/bin build/tsan build/rpm build/dist $(DIST_TAR) build/conch-init_*.deb  # build/vm (the image cache) and $(ARM64_SYSROOT) are kept
