#!/usr/bin/env bash
# Boot-to-ready benchmark of conch-init as PID 1 in namespaces (root only).
# CONCH_INIT_BIN (default build/dev/conch-init), BOOT_RUNS (default 5).
set -u
cd "$(dirname "$0")/../.."
exec /usr/bin/python3 tests/bench/boot.py
