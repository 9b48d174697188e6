#!/usr/bin/env bash
# The workload envelope's cost in a real microVM (root only): StartProcess
# `/bin/true` round trips with the envelope against the same guest booted
# with CONCH_ENVELOPE=0.  VM_ENVELOPE_ROUNDS boots of each (default 2,
# alternating), VM_ENVELOPE_N round trips per boot (default 300).
set -eu
cd "$(dirname "$0")/../.."
make -s vm-image >/dev/null
exec /usr/bin/python3 tests/bench/vm_envelope.py
