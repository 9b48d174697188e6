#!/usr/bin/env bash
# Keystroke echo round trip through a PTY.  Not part of `make check`.
#
#   conch: SendInput{pid, pty: one byte} over HTTP/1.1 keep-alive (proto
#     codec) → the data event carrying the echoed byte on the foreground
#     StartProcess stream of a PTY process (`stty raw -echo; exec cat`);
#   bare:  the same child on a PTY of our own, write(master) → read(master).
#   stream: the same through one StreamInput (a chunk per key, no answer per key).
# Both in tests/bench/keystroke.c, in the same run, interleaved in BLOCKS
# blocks; p50/p99 over the pooled samples and the ratio conch/bare.
# Aim: p50 ≤ 2×.  For scale, GET /health (one HTTP/1.1 round trip on the
# same loopback, tests/bench/rtt.c) is timed too: a keystroke through the
# server cannot beat one such round trip plus the bare PTY echo.
#
# Usage: tests/bench/keystroke.sh
# Environment: N (2000) WARM (100) round trips, BLOCKS (4);
#   CONCH_INIT_BIN (default build/dev/conch-init, rebuilt with `make`).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
N=${N:-2000}
WARM=${WARM:-100}
BLOCKS=${BLOCKS:-4}
if [ -z "${CONCH_INIT_BIN:-}" ]; then
  make -s dev >/dev/null
  BIN=build/dev/conch-init
else
  BIN=$CONCH_INIT_BIN
fi
mkdir -p build/bench
CFLAGS="-std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wvla"
cc $CFLAGS -o build/bench/keystroke tests/bench/keystroke.c tests/bench/stats.c -lutil
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2
KS=build/bench/keystroke

W=$(mktemp -d /tmp/conch-kbench.XXXXXX)
cleanup() {
  if [ -n "${CIPID:-}" ]; then kill "$CIPID" 2>/dev/null || true; wait "$CIPID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
PORT=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
TOK=bench-$RANDOM$RANDOM
"$BIN" serve --listen 127.0.0.1:$PORT --token "$TOK" --log-level warn 2>"$W/server.log" & CIPID=$!
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:$PORT/health >/dev/null 2>&1 && break
  kill -0 $CIPID 2>/dev/null || { cat "$W/server.log"; exit 1; }
  sleep 0.05
done

NB=$(( (N + BLOCKS - 1) / BLOCKS ))
WB=$(( WARM / BLOCKS > 10 ? WARM / BLOCKS : 10 ))
bare="" conch="" stream="" health=""
for _ in $(seq $BLOCKS); do
  health+=$(build/bench/rtt --port $PORT --health -n $NB -w $WB | head -1)$'\n'
  bare+=$($KS --bare -n $NB -w $WB)$'\n'
  conch+=$($KS --port $PORT --token "$TOK" -n $NB -w $WB)$'\n'
  stream+=$($KS --port $PORT --token "$TOK" --stream -n $NB -w $WB)$'\n'
done
kv() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p"; }
med() { sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
echo "$bare$conch$stream" | sed '/^$/d'
b50=$(echo "$bare" | kv p50_us | med); b99=$(echo "$bare" | kv p99_us | med)
c50=$(echo "$conch" | kv p50_us | med); c99=$(echo "$conch" | kv p99_us | med)
s50=$(echo "$stream" | kv p50_us | med); s99=$(echo "$stream" | kv p99_us | med)
h50=$(echo "$health" | kv p50_us | med); h99=$(echo "$health" | kv p99_us | med)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
echo
printf '%-52s %9s %9s\n' "keystroke echo round trip, us (median of $BLOCKS blocks)" p50 p99
printf '%-52s %9s %9s\n' "bare PTY write -> read (baseline)" "$b50" "$b99"
printf '%-52s %9s %9s\n' "SendInput -> pty data event, HTTP/1.1 proto" "$c50" "$c99"
printf '%-52s %9s %9s   (aim p50 <= 2x)\n' "  ratio" "$(ratio "$c50" "$b50")" "$(ratio "$c99" "$b99")"
printf '%-52s %9s %9s\n' "StreamInput chunk -> pty data event, HTTP/1.1 proto" "$s50" "$s99"
printf '%-52s %9s %9s   (aim p50 <= 2x)\n' "  ratio" "$(ratio "$s50" "$b50")" "$(ratio "$s99" "$b99")"
printf '%-52s %9s %9s\n' "GET /health HTTP/1.1 (one loopback round trip)" "$h50" "$h99"
printf '%-52s %9s\n' "  floor: (health + bare) / bare" "$(awk -v h="$h50" -v b="$b50" 'BEGIN{printf "%.2f", (h + b) / b}')"
echo "server RSS: $(awk '/VmRSS/{print $2}' /proc/$CIPID/status) KiB"
