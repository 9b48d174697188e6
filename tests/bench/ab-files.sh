#!/usr/bin/env bash
# tests/bench/ab-files.sh BIN_A BIN_B [BIN_C …] — GetFileStream and
# PostFileStream (HTTP/1.1 and h2c, curl) of SIZE_MIB (default 256) on a
# tmpfs, against conch-init binaries served side by side: each round runs
# every binary once, back to back, the order rotating, so that the shared
# machine's swings (2x within a minute here) hit them alike.  Prints each
# binary's median MiB/s over ROUNDS (default 15) and the median of the
# rounds' own speed ratios against the first binary, and each binary's
# median CPU time (all its threads, from schedstat) per MiB moved — the
# steadier figure when a change takes work off the server.  Then each
# binary's peak RSS (VmHWM) while PEAK_UPLOADS (default 8) uploads of
# 64 MiB run at once against a fresh server, median of 3.  Needs root
# (tmpfs).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_MIB=${SIZE_MIB:-256} ROUNDS=${ROUNDS:-15}
[ $# -ge 2 ] || { echo "usage: $0 BIN_A BIN_B [BIN_C …]"; exit 2; }
BINS=("$@")
W=$(mktemp -d /tmp/conch-abfiles.XXXXXX)
mount -t tmpfs -o size=$((SIZE_MIB * 4 + 256))m tmpfs "$W"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; umount "$W" 2>/dev/null || true; rmdir "$W" 2>/dev/null || true; }
trap cleanup EXIT
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$W/big"
# a proto GetFileRequest envelope, and the PostFileStream body in 1 MiB chunks
/usr/bin/python3 - "$W" <<'PY'
import struct, sys
w = sys.argv[1]
def enc(n):
    o = b""
    while True:
        c = n & 0x7f; n >>= 7
        if n: o += bytes([c | 0x80])
        else: return o + bytes([c])
def s(field, b): return bytes([field << 3 | 2]) + enc(len(b)) + b
def env(p, f=0): return struct.pack(">BI", f, len(p)) + p
open(f"{w}/get.env", "wb").write(env(s(1, f"{w}/big".encode())))
with open(f"{w}/big", "rb") as src, open(f"{w}/post.env", "wb") as out:
    first = True
    while True:
        b = src.read(1 << 20)
        if not b: break
        out.write(env((s(1, f"{w}/up".encode()) if first else b"") + s(2, b))); first = False
with open(f"{w}/big", "rb") as src, open(f"{w}/post64.env", "wb") as out:
    for i in range(64):
        out.write(env((s(1, f"{w}/up64".encode()) if i == 0 else b"") + s(2, src.read(1 << 20))))
PY
port() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
PORTS=()
for b in "${BINS[@]}"; do p=$(port); "$b" serve --listen 127.0.0.1:$p --token tok --log-level error & PIDS+=($!); PORTS+=($p); done
sleep 0.5
H=(-H "conch-init-token: tok" -H 'Content-Type: application/connect+proto')
t() { curl -s -o /dev/null -w '%{time_total}' "$@"; }
# CPU ns of every thread of server i so far
cpu() { cat /proc/"${PIDS[$1]}"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'; }
# seconds and server CPU ns of one transfer: tc I CURL-ARGS…
tc() { local i=$1 a b s; shift; a=$(cpu "$i"); s=$(t "$@"); b=$(cpu "$i"); echo "$s $((b - a))"; }
n=${#BINS[@]}
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    i=$(((k + r) % n)); p=${PORTS[$i]}
    g1=$(tc "$i" "${H[@]}" --data-binary @"$W/get.env" http://127.0.0.1:$p/pb.FileService/GetFileStream)
    g2=$(tc "$i" --http2-prior-knowledge "${H[@]}" --data-binary @"$W/get.env" http://127.0.0.1:$p/pb.FileService/GetFileStream)
    rm -f "$W/up"; p1=$(tc "$i" "${H[@]}" -X POST -T "$W/post.env" http://127.0.0.1:$p/pb.FileService/PostFileStream)
    rm -f "$W/up"; p2=$(tc "$i" --http2-prior-knowledge "${H[@]}" -X POST -T "$W/post.env" http://127.0.0.1:$p/pb.FileService/PostFileStream)
    echo "$r $i $g1 $g2 $p1 $p2"
  done
done > "$W/res"
/usr/bin/python3 - "$W/res" "$SIZE_MIB" "${BINS[@]}" <<'PY'
import sys, statistics as st
res, size, names = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rounds, cpu = {}, {}
for line in open(res):
    r, i, *ts = line.split()
    rounds.setdefault(int(r), {})[int(i)] = [size / float(x) for x in ts[0::2]]
    cpu.setdefault(int(i), []).append([float(x) / 1e6 / size for x in ts[1::2]])
cols = "GetFileStream h1, GetFileStream h2c, PostFileStream h1, PostFileStream h2c"
print(f"MiB/s, median of {len(rounds)} rounds ({cols}); then the median of the rounds' ratios to {names[0]}")
for i, n in enumerate(names):
    v = [d[i] for d in rounds.values()]
    med = [round(st.median(x[k] for x in v)) for k in range(4)]
    rat = [round(st.median(d[i][k] / d[0][k] for d in rounds.values()), 3) for k in range(4)]
    ms = [round(st.median(x[k] for x in cpu[i]), 3) for k in range(4)]
    print(f"{n:40s} {med}  ratio {rat}  server CPU ms/MiB {ms}")
PY

# peak memory of concurrent uploads, a fresh server each time
K=${PEAK_UPLOADS:-8}
peak() {
  local p pid c=() hwm
  p=$(port)
  "$1" serve --listen 127.0.0.1:$p --token tok --log-level error & pid=$!
  PIDS+=("$pid")
  sleep 0.3
  for _ in $(seq "$K"); do
    curl -s -o /dev/null "${H[@]}" -X POST -T "$W/post64.env" http://127.0.0.1:$p/pb.FileService/PostFileStream & c+=($!)
  done
  wait "${c[@]}"
  hwm=$(awk '/VmHWM/{print $2}' /proc/"$pid"/status)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$W/up64"
  echo "$hwm"
}
line="peak RSS KiB, $K uploads of 64 MiB at once (median of 3):"
for b in "${BINS[@]}"; do
  v=$(for _ in 1 2 3; do peak "$b"; done | sort -n | sed -n 2p)
  line="$line $b $v"
done
echo "$line"
