#!/usr/bin/env bash
# Namespace tests of conch-init as PID 1 (root only).  CONCH_INIT_BIN picks
# the binary (default build/asan/conch-init).
set -u
cd "$(dirname "$0")/../.."
export CONCH_INIT_BIN=${CONCH_INIT_BIN:-$PWD/build/asan/conch-init}
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/ns "$@"
