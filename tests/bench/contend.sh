#!/usr/bin/env bash
# An answer's latency on an HTTP/2 connection that carries a download.
# Not part of `make check`.
#
#   tests/bench/contend.sh [BIN_A [BIN_B …]]
#
# For each binary (default build/dev/conch-init) and ROUNDS (5) rounds, the
# binaries alternating: tests/bench/contend.py against it — /health p50 on
# an idle h2c connection (the baseline, same run), then during a
# GetFileStream of SIZE_MIB (512) MiB from a tmpfs on that connection.
# Prints each round's line and, per binary, the median over rounds of the
# busy p50, p90 and busy/idle ratio.  Needs root (tmpfs).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_MIB=${SIZE_MIB:-512} ROUNDS=${ROUNDS:-5}
if [ $# -eq 0 ]; then make -s dev >/dev/null; set -- build/dev/conch-init; fi
BINS=("$@")
/usr/bin/python3 -c 'import h2' 2>/dev/null || { echo "missing python3-h2 (apt-get install python3-h2)"; exit 1; }
W=$(mktemp -d /tmp/conch-contend.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; umount "$W" 2>/dev/null || true; rmdir "$W" 2>/dev/null || true; }
trap cleanup EXIT
mount -t tmpfs -o size=$((SIZE_MIB + 64))m tmpfs "$W"
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$W/big"
port() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PORTS=()
for b in "${BINS[@]}"; do
  p=$(port); PORTS+=("$p")
  "$b" serve --listen 127.0.0.1:$p --token bench --log-level error & PIDS+=($!)
done
sleep 0.5
declare -A LINES
for r in $(seq "$ROUNDS"); do
  for i in "${!BINS[@]}"; do
    l=$(/usr/bin/python3 tests/bench/contend.py "${PORTS[i]}" bench "$W/big")
    echo "round $r ${BINS[i]}: $l"
    LINES[$i]+="$l"$'\n'
  done
done
echo "median of $ROUNDS rounds: /health during a $SIZE_MIB MiB download on the same h2c connection"
for i in "${!BINS[@]}"; do
  printf '%s' "${LINES[$i]}" | /usr/bin/python3 -c '
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in sys.stdin if l.strip()]
m = {k: statistics.median(float(r[k]) for r in rows) for k in rows[0]}
print("%-40s idle p50 %.3f ms  busy p50 %.2f ms  p90 %.2f ms  busy/idle %.1f  download %.0f MiB/s"
      % (sys.argv[1], m["idle_p50_ms"], m["busy_p50_ms"], m["busy_p90_ms"], m["ratio"], m["mib_s"]))' "${BINS[i]}"
done
