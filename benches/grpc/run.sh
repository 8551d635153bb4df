#!/usr/bin/env bash
# gRPC unary calls (h2c) through sluicegate and through nginx's grpc_pass, side by side
# on one core, with h2load: the client, the gRPC backend
# (examples/bench_grpc_backend.rs, h2c) and each proxy (one worker) pinned to CPU $CPU,
# a limit that never rejects on sluicegate's route. Each call is a POST of one 10-byte
# message with `content-type: application/grpc` and `te: trailers`, answered with the
# message and `grpc-status: 0` in the trailers. The proxies run alternately, REPS times
# each; CPU per call is the proxy's user + system time over the calls.
#
#   benches/grpc/run.sh
#
# REQUESTS [60000] per run, CLIENTS [16] connections, STREAMS [8] per connection,
# REPS [3], CPU [0]. Needs h2load (apt-get install nghttp2-client) and nginx.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SG="${SG:-$ROOT/target/dist/sluicegate}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
REQUESTS="${REQUESTS:-60000}" CLIENTS="${CLIENTS:-16}" STREAMS="${STREAMS:-8}" REPS="${REPS:-3}" CPU="${CPU:-0}"
BACKEND_BIN="$ROOT/target/release/examples/bench_grpc_backend"
command -v h2load >/dev/null || { echo "h2load is needed (apt-get install nghttp2-client)" >&2; exit 1; }
[[ -x "$NGINX" ]] || { echo "nginx is needed (apt-get install nginx)" >&2; exit 1; }
(cd "$ROOT" && cargo build --profile dist --no-default-features --quiet --bin sluicegate && cargo build --release --quiet --example bench_grpc_backend)

TMP="$(mktemp -d /tmp/sluicegate-grpc.XXXXXX)"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ready() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing on $1" >&2; exit 1; }
# One framed message: no compression, length 10, then field 1 (a string of 8 bytes).
printf '\x00\x00\x00\x00\x0a\x0a\x08sluicega' >"$TMP/call.bin"

BACKEND_PORT="$(port)"
taskset -c "$CPU" "$BACKEND_BIN" "127.0.0.1:$BACKEND_PORT" >/dev/null 2>&1 &
PIDS+=($!)
ready "$BACKEND_PORT"

declare -A PORT PID
SG_PORT="$(port)"
cat >"$TMP/sg.yaml" <<EOC
listen: 127.0.0.1:$SG_PORT
server:
  workers: 1
upstreams:
  backend: { servers: ["127.0.0.1:$BACKEND_PORT"], http2: true }
limits:
  per_ip: { key: ip, rate: 100000000r/s, burst: 1000, nodelay: true }
routes:
  - { match: { path_prefix: /bench.Echo/ }, upstream: backend, limits: [per_ip] }
EOC
taskset -c "$CPU" "$SG" -c "$TMP/sg.yaml" --log-level warn 2>"$TMP/sg.log" &
PID[sluicegate]=$!; PIDS+=($!); PORT[sluicegate]=$SG_PORT
ready "$SG_PORT"

NGINX_PORT="$(port)"
mkdir -p "$TMP/nginx"
cat >"$TMP/nginx.conf" <<EOC
worker_processes 1;
daemon off;
master_process off;
error_log $TMP/nginx/error.log warn;
pid $TMP/nginx/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx;
  upstream backend { server 127.0.0.1:$BACKEND_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGINX_PORT http2;
    keepalive_requests 100000000;
    location /bench.Echo/ { grpc_pass grpc://backend; }
  }
}
EOC
taskset -c "$CPU" "$NGINX" -c "$TMP/nginx.conf" -p "$TMP/nginx" &
PID[nginx]=$!; PIDS+=($!); PORT[nginx]=$NGINX_PORT
ready "$NGINX_PORT"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK="$(getconf CLK_TCK)"
echo "| run | proxy | calls/s | CPU µs/call |"
echo "|---|---|---|---|"
for rep in $(seq "$REPS"); do
  for name in sluicegate nginx; do
    c0="$(ticks "${PID[$name]}")"
    out="$(taskset -c "$CPU" h2load -n "$REQUESTS" -c "$CLIENTS" -m "$STREAMS" -d "$TMP/call.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:${PORT[$name]}/bench.Echo/Unary" 2>&1)"
    c1="$(ticks "${PID[$name]}")"
    echo "$out" | grep -q "succeeded, 0 failed, 0 errored" || { echo "$out" >&2; exit 1; }
    echo "$out" | grep -q "status codes: $REQUESTS 2xx" || { echo "$out" >&2; exit 1; }
    rps="$(echo "$out" | awk '/^finished in/ {print $4}')"
    cpu="$(awk -v d=$((c1 - c0)) -v t="$TCK" -v n="$REQUESTS" 'BEGIN { printf "%.2f", d / t * 1e6 / n }')"
    echo "| $rep | $name | $rps | $cpu |"
  done
done
