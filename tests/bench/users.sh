#!/usr/bin/env bash
# StartProcess as a user against as root, same run: /bin/true,
# foreground, connect+proto, one keep-alive connection (tests/bench/rtt.c),
# the two interleaved in BLOCKS blocks so that the machine's drift hits
# both; statistics over the pooled samples.  Goal: p50 as a user ≤ 1.05×
# as root.  The user is `nobody` (every Debian system has it): the calls
# resolve it from the cached /etc/passwd, the child takes its groups, gid
# and uid, the working directory and the $PATH lookup run with its fsuid.
#
# Usage: tests/bench/users.sh
# Environment: N (2000) WARM (100) calls, BLOCKS (8); USER_SPEC (nobody);
#   CONCH_INIT_BIN (default build/dev/conch-init, rebuilt with `make`);
#   STRICT=1 makes a missed goal an exit status of 1.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
N=${N:-2000}
WARM=${WARM:-100}
BLOCKS=${BLOCKS:-8}
USER_SPEC=${USER_SPEC:-nobody}
STRICT=${STRICT:-0}
if [ -z "${CONCH_INIT_BIN:-}" ]; then
  make -s dev >/dev/null
  BIN=build/dev/conch-init
else
  BIN=$CONCH_INIT_BIN
fi
mkdir -p build/bench
cc -std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -o build/bench/rtt \
  tests/bench/rtt.c tests/bench/stats.c -lnghttp2
RTT=build/bench/rtt
W=$(mktemp -d /tmp/conch-ubench.XXXXXX)
cleanup() {
  if [ -n "${CIPID:-}" ]; then kill "$CIPID" 2>/dev/null || true; wait "$CIPID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
PORT=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
TOK=bench-$RANDOM$RANDOM
echo "$TOK" > "$W/token"
"$BIN" serve --listen 127.0.0.1:$PORT --token-file "$W/token" --log-level warn 2>"$W/server.log" & CIPID=$!
for _ in $(seq 100); do
  $RTT --port $PORT --health -n 1 -w 0 >/dev/null 2>&1 && break
  sleep 0.05
done
# sanity: the user's call runs as the user
$RTT --port $PORT --token "$TOK" --user "$USER_SPEC" -n 1 -w 0 --expect-stdout $(( $(id -un "$USER_SPEC" | wc -c) )) \
  -- id -un >/dev/null || { echo "users.sh: StartProcess as $USER_SPEC failed"; tail -5 "$W/server.log"; exit 1; }

NB=$(( (N + BLOCKS - 1) / BLOCKS ))
WB=$(( WARM / BLOCKS > 10 ? WARM / BLOCKS : 10 ))
for _ in $(seq $BLOCKS); do
  $RTT --port $PORT --token "$TOK" -n $NB -w $WB -o "$W/root.raw" -- /bin/true >/dev/null
  $RTT --port $PORT --token "$TOK" --user "$USER_SPEC" -n $NB -w $WB -o "$W/user.raw" -- /bin/true >/dev/null
done
p50() { sort -n "$1" | awk '{v[NR] = $1} END { r = int((NR * 50 + 99) / 100); printf "%.1f", v[r] / 1e3 }'; }
p99() { sort -n "$1" | awk '{v[NR] = $1} END { r = int((NR * 99 + 99) / 100); printf "%.1f", v[r] / 1e3 }'; }
r50=$(p50 "$W/root.raw") u50=$(p50 "$W/user.raw") r99=$(p99 "$W/root.raw") u99=$(p99 "$W/user.raw")
ratio=$(awk -v a="$u50" -v b="$r50" 'BEGIN{printf "%.3f", a / b}')
echo
printf '%-40s %9s %9s\n' "StartProcess /bin/true, us (N=$(( NB * BLOCKS )))" p50 p99
printf '%-40s %9s %9s\n' "as root" "$r50" "$r99"
printf '%-40s %9s %9s\n' "as $USER_SPEC (conch-init-user)" "$u50" "$u99"
ok=$(awk -v r="$ratio" 'BEGIN{print (r <= 1.05) ? "ok" : "MISS"}')
echo "user / root p50: ${ratio}x (goal <= 1.05x) $ok"
[ "$STRICT" = 1 ] && [ "$ok" = MISS ] && exit 1
exit 0
