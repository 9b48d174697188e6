#!/usr/bin/env bash
# tests/bench/files-http.sh [BIN] — /files over plain HTTP against nginx
# (Debian's nginx-core) serving the same file from the same tmpfs, in the
# same run: a GET of SIZE_MIB (default 1024) over HTTP/1.1 loopback into
# `curl -o /dev/null` (conch-init: sendfile; nginx: `sendfile on`), and a
# PUT (`curl -T`; nginx: `dav_methods PUT`), each the median of ROUNDS
# (default 5), alternating; the h2c figures of conch-init (reported, no
# baseline); and conch-init's RSS growth (VmRSS) while 8 clients each GET
# 256 MiB reading slowly (--limit-rate).  Prints the ratios; exits 1 when
# GET < 0.9x or PUT < 0.8x nginx, or the RSS growth passes 16 MiB.
# Needs root (tmpfs mount), curl, nginx-core.  Loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/dev/conch-init}
SIZE_MIB=${SIZE_MIB:-1024} ROUNDS=${ROUNDS:-5}
command -v nginx >/dev/null || { echo "needs nginx (apt-get install nginx-core)"; exit 2; }
W=$(mktemp -d /tmp/conch-fhbench.XXXXXX)
mount -t tmpfs -o size=$((SIZE_MIB * 3 + 512))m tmpfs "$W"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$W/nginx.pid" ] && kill "$(cat "$W/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true; sleep 0.2; umount "$W" 2>/dev/null || true; rmdir "$W" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$W/www" "$W/ng"
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$W/www/big"
port() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
CP=$(port) NP=$(port)
"$BIN" serve --listen 127.0.0.1:$CP --token tok --log-level error & PIDS+=($!)
CPID=$!
cat > "$W/ng/nginx.conf" <<NG
daemon on; worker_processes 1; pid $W/nginx.pid; error_log $W/ng/error.log;
events { worker_connections 64; }
http {
  access_log off; sendfile on; tcp_nopush on;
  client_body_temp_path $W/ng/body; proxy_temp_path $W/ng/p; fastcgi_temp_path $W/ng/f;
  uwsgi_temp_path $W/ng/u; scgi_temp_path $W/ng/s;
  client_max_body_size 0; client_body_buffer_size 1m;
  server { listen 127.0.0.1:$NP; root $W/www; dav_methods PUT; create_full_put_path on; }
}
NG
nginx -c "$W/ng/nginx.conf" -p "$W/ng" 2>/dev/null || nginx -c "$W/ng/nginx.conf"
sleep 0.5
H=(-H "conch-init-token: tok")
speed() { curl -s -o /dev/null -w '%{speed_download} %{speed_upload}' "$@"; }
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mib() { awk '{printf "%.0f", $1 / 1048576}'; }
: > "$W/cg"; : > "$W/ng_g"; : > "$W/cp"; : > "$W/ng_p"; : > "$W/c2g"; : > "$W/c2p"
for r in $(seq "$ROUNDS"); do
  speed "${H[@]}" "http://127.0.0.1:$CP/files?path=$W/www/big" | awk '{print $1}' >> "$W/cg"
  speed "http://127.0.0.1:$NP/big" | awk '{print $1}' >> "$W/ng_g"
  speed "${H[@]}" -T "$W/www/big" "http://127.0.0.1:$CP/files?path=$W/up/c" | awk '{print $2}' >> "$W/cp"
  speed -T "$W/www/big" "http://127.0.0.1:$NP/up/n" | awk '{print $2}' >> "$W/ng_p"
  speed --http2-prior-knowledge "${H[@]}" "http://127.0.0.1:$CP/files?path=$W/www/big" | awk '{print $1}' >> "$W/c2g"
  speed --http2-prior-knowledge "${H[@]}" -T "$W/www/big" "http://127.0.0.1:$CP/files?path=$W/up/c2" | awk '{print $2}' >> "$W/c2p"
  rm -f "$W/up/c" "$W/up/n" "$W/up/c2"
done
cg=$(med < "$W/cg") ng=$(med < "$W/ng_g") cp=$(med < "$W/cp") np=$(med < "$W/ng_p")
c2g=$(med < "$W/c2g") c2p=$(med < "$W/c2p")
rg=$(awk -v a="$cg" -v b="$ng" 'BEGIN {printf "%.2f", a / b}')
rp=$(awk -v a="$cp" -v b="$np" 'BEGIN {printf "%.2f", a / b}')
echo "GET  ${SIZE_MIB} MiB HTTP/1.1: conch-init $(echo "$cg" | mib) MiB/s, nginx $(echo "$ng" | mib) MiB/s: ${rg}x (target >= 0.9)"
echo "PUT  ${SIZE_MIB} MiB HTTP/1.1: conch-init $(echo "$cp" | mib) MiB/s, nginx $(echo "$np" | mib) MiB/s: ${rp}x (target >= 0.8)"
echo "h2c: GET $(echo "$c2g" | mib) MiB/s, PUT $(echo "$c2p" | mib) MiB/s (conch-init)"
# RSS during 8 slow GETs of 256 MiB: HTTP/1.1 (sendfile), then h2c (pool reads)
head -c $((256 * 1024 * 1024)) "$W/www/big" > "$W/www/q"
rss() { awk '/^VmRSS:/ {print $2}' /proc/"$CPID"/status; }
slow8() {
  local before peak v alive CURLS=() i p
  before=$(rss) peak=$before
  for i in $(seq 8); do
    curl -s -o /dev/null --limit-rate 20M "$@" "${H[@]}" "http://127.0.0.1:$CP/files?path=$W/www/q" & CURLS+=($!)
  done
  for i in $(seq 80); do
    sleep 0.25; v=$(rss); [ "$v" -gt "$peak" ] && peak=$v
    alive=0; for p in "${CURLS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done; [ $alive = 1 ] || break
  done
  for p in "${CURLS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${CURLS[@]}" 2>/dev/null || true
  echo $(( (peak - before) / 1024 ))
}
grow=$(slow8)
grow2=$(slow8 --http2-prior-knowledge)
echo "RSS growth during 8 slow 256 MiB GETs: HTTP/1.1 ${grow} MiB, h2c ${grow2} MiB (target <= 16)"
[ "$grow2" -gt "$grow" ] && grow=$grow2
ok=$(awk -v g="$rg" -v p="$rp" -v m="$grow" 'BEGIN {print (g >= 0.9 && p >= 0.8 && m <= 16) ? 1 : 0}')
[ "$ok" = 1 ] && echo "1 passed, 0 failed" || { echo "0 passed, 1 failed"; exit 1; }
