#!/usr/bin/env bash
# ProcessService benchmarks (issue 3).  Not part of `make check`.
#
#   * StartProcess round trip of /bin/true (foreground, connect+proto, one
#     keep-alive connection, N sequential calls after a warm-up) over
#     HTTP/1.1 and h2c, against N × posix_spawn+waitpid of /bin/true in the
#     same run (tests/bench/spawn.c).  Target: p50 ≤ 1.5× the bare spawn.
#     GET /health rows show the transport's share of the round trip.
#   * stdout throughput: `head -c SIZE /dev/zero` through a foreground
#     StartProcess stream (client counts and checks the stdout bytes) against
#     `head -c SIZE /dev/zero | cat >/dev/null`, best of REPS.  Target ≥ 0.5×.
#   * idle RSS of conch-init (and after the runs).
#
# Usage: tests/bench/process.sh
# Environment: N (2000) WARM (100) calls; SIZE bytes (1073741824); REPS (3);
#   CONCH_INIT_BIN (default build/dev/conch-init, rebuilt with `make`);
#   STRICT=1 makes a missed target an exit status of 1.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
N=${N:-2000}
WARM=${WARM:-100}
SIZE=${SIZE:-1073741824}
REPS=${REPS:-3}
STRICT=${STRICT:-0}
if [ -z "${CONCH_INIT_BIN:-}" ]; then
  make -s dev >/dev/null
  BIN=build/dev/conch-init
else
  BIN=$CONCH_INIT_BIN
fi
[ -x "$BIN" ] || { echo "process.sh: $BIN is not executable"; exit 1; }

# ---- tools
mkdir -p build/bench
CFLAGS="-std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wvla"
cc $CFLAGS -o build/bench/spawn tests/bench/spawn.c tests/bench/stats.c
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2
RTT=build/bench/rtt

# ---- server
W=$(mktemp -d /tmp/conch-pbench.XXXXXX)
cleanup() {
  if [ -n "${CIPID:-}" ]; then kill "$CIPID" 2>/dev/null || true; wait "$CIPID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
PORT=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
TOK=bench-$RANDOM$RANDOM
"$BIN" serve --listen 127.0.0.1:$PORT --token "$TOK" --log-level warn 2>"$W/server.log" & CIPID=$!
up=0
for _ in $(seq 100); do
  if $RTT --port $PORT --health -n 1 -w 0 >/dev/null 2>&1; then up=1; break; fi
  kill -0 $CIPID 2>/dev/null || break
  sleep 0.05
done
[ $up = 1 ] || { echo "process.sh: server did not come up"; cat "$W/server.log"; exit 1; }
RSS_IDLE=$(awk '/VmRSS/{print $2}' /proc/$CIPID/status)

# sanity: StartProcess works on this build, over both protocols
for p in "" --h2; do
  if ! $RTT --port $PORT --token "$TOK" $p -n 1 -w 0 --expect-stdout 3 -- echo hi >"$W/sanity" 2>&1; then
    echo "process.sh: StartProcess sanity check failed${p:+ ($p)}:"; cat "$W/sanity"; tail -5 "$W/server.log"; exit 1
  fi
done

kv() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p" | head -1; }
cpu() { awk '{print $14 + $15}' /proc/$CIPID/stat; }
HZ=$(getconf CLK_TCK)

# ---- round trip
spawn_out=$(build/bench/spawn -n $N -w $WARM)
h1_out=$($RTT --port $PORT --token "$TOK" -n $N -w $WARM -- /bin/true)
h2_out=$($RTT --port $PORT --token "$TOK" --h2 -n $N -w $WARM -- /bin/true)
hh1_out=$($RTT --port $PORT -n $N -w $WARM --health)
hh2_out=$($RTT --port $PORT --h2 -n $N -w $WARM --health)
for o in "$h1_out" "$h2_out"; do
  [ "$(echo "$o" | kv reconnects)" = 0 ] || echo "WARNING: the server closed a keep-alive connection during the run"
done
sp50=$(echo "$spawn_out" | kv p50_us)
sp99=$(echo "$spawn_out" | kv p99_us)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
missed=0
row() { # label, stats output, compare to spawn?
  local p50 p99 mean r50="" r99=""
  p50=$(echo "$2" | kv p50_us); p99=$(echo "$2" | kv p99_us); mean=$(echo "$2" | kv mean_us)
  if [ "$3" = 1 ]; then r50=$(ratio "$p50" "$sp50"); r99=$(ratio "$p99" "$sp99"); fi
  local mark=""
  if [ "$4" = 1 ]; then
    if awk -v r="$r50" 'BEGIN{exit !(r <= 1.5)}'; then mark=ok; else mark=MISS; missed=1; fi
  fi
  printf '%-44s %9s %9s %9s %8s %8s %6s\n' "$1" "$p50" "$p99" "$mean" "$r50" "$r99" "$mark"
}
echo
printf '%-44s %9s %9s %9s %8s %8s %6s\n' "round trip, us (N=$N after $WARM warm-up)" p50 p99 mean "x p50" "x p99" "<=1.5x"
row "posix_spawn+waitpid /bin/true (baseline)" "$spawn_out" 1 0
row "StartProcess /bin/true HTTP/1.1 keep-alive" "$h1_out" 1 1
row "StartProcess /bin/true h2c" "$h2_out" 1 1
row "GET /health HTTP/1.1 (transport only)" "$hh1_out" 1 0
row "GET /health h2c (transport only)" "$hh2_out" 1 0

# ---- stdout throughput
MIB=$(awk -v s=$SIZE 'BEGIN{printf "%.0f", s / 1048576}')
best_pipe=999999
for _ in $(seq $REPS); do
  s=$(date +%s.%N); head -c $SIZE /dev/zero | cat >/dev/null; e=$(date +%s.%N)
  best_pipe=$(awk -v s=$s -v e=$e -v b=$best_pipe 'BEGIN{d = e - s; printf "%.6f", d < b ? d : b}')
done
thru() { # protocol flag → "best_seconds server_cpu_seconds_per_run"
  local c0 c1 out
  c0=$(cpu)
  out=$($RTT --port $PORT --token "$TOK" $1 -n $REPS -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero)
  c1=$(cpu)
  awk -v m="$(echo "$out" | kv min_us)" -v c=$((c1 - c0)) -v hz=$HZ -v r=$REPS \
    'BEGIN{printf "%.6f %.2f", m / 1e6, c / hz / r}'
}
r1=$(thru ""); read -r t1 cpu1 <<<"$r1"
r2=$(thru --h2); read -r t2 cpu2 <<<"$r2"
trow() { # label seconds server-cpu target?
  local r mark=""
  r=$(awk -v b=$best_pipe -v t=$2 'BEGIN{printf "%.2f", b / t}')
  if [ "$4" = 1 ]; then
    if awk -v r="$r" 'BEGIN{exit !(r >= 0.5)}'; then mark=ok; else mark=MISS; missed=1; fi
  fi
  printf '%-44s %9.3f %9.0f %9s %8s %8s\n' "$1" "$2" "$(awk -v m=$MIB -v t=$2 'BEGIN{print m / t}')" "$3" "$r" "$mark"
}
echo
printf '%-44s %9s %9s %9s %8s %8s\n' "stdout throughput, $MIB MiB (best of $REPS)" seconds "MiB/s" "srv cpu" "ratio" ">=0.5x"
trow "head | cat >/dev/null (baseline)" "$best_pipe" "" 0
trow "StartProcess stdout HTTP/1.1" "$t1" "$cpu1" 1
trow "StartProcess stdout h2c" "$t2" "$cpu2" 1

RSS_AFTER=$(awk '/VmRSS/{print $2}' /proc/$CIPID/status)
echo
echo "conch-init RSS: idle ${RSS_IDLE} KiB, after the runs ${RSS_AFTER} KiB"
if grep -q . "$W/server.log"; then echo "server log (warn and above):"; tail -5 "$W/server.log"; fi
[ "$STRICT" = 1 ] && [ $missed = 1 ] && exit 1
exit 0
