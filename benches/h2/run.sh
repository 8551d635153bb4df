#!/usr/bin/env bash
# HTTP/2 (h2c, prior knowledge) through sluicegate on one core, with h2load: the client,
# the backend (examples/bench_backend.rs, HTTP/1) and each proxy (`server.workers: 1`)
# pinned to CPU $CPU, a limit that never rejects on the route. With SG_BEFORE set to
# another sluicegate binary, both run side by side, alternating, REPS times each: the
# figure for "HTTP/2 no slower than before".
#
#   benches/h2/run.sh                            # SG [target/dist/sluicegate]
#   SG_BEFORE=/path/to/old/sluicegate benches/h2/run.sh
#
# REQUESTS [60000] per run, CLIENTS [16] connections, STREAMS [8] per connection,
# REPS [3], CPU [0]. Needs h2load (apt-get install nghttp2-client).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SG="${SG:-$ROOT/target/dist/sluicegate}"
SG_BEFORE="${SG_BEFORE:-}"
REQUESTS="${REQUESTS:-60000}" CLIENTS="${CLIENTS:-16}" STREAMS="${STREAMS:-8}" REPS="${REPS:-3}" CPU="${CPU:-0}"
BACKEND_BIN="$ROOT/target/release/examples/bench_backend"
command -v h2load >/dev/null || { echo "h2load is needed (apt-get install nghttp2-client)" >&2; exit 1; }
(cd "$ROOT" && cargo build --profile dist --no-default-features --quiet --bin sluicegate && cargo build --release --quiet --example bench_backend)

TMP="$(mktemp -d /tmp/sluicegate-h2.XXXXXX)"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ready() { for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0; sleep 0.1; done; echo "nothing on $1" >&2; exit 1; }

BACKEND_PORT="$(port)"
taskset -c "$CPU" "$BACKEND_BIN" "127.0.0.1:$BACKEND_PORT" >/dev/null 2>&1 &
PIDS+=($!)
ready "$BACKEND_PORT"

declare -A PORT PID
start() { # $1 name, $2 binary
  local p; p="$(port)"
  cat >"$TMP/$1.yaml" <<EOC
listen: 127.0.0.1:$p
server:
  workers: 1
upstreams:
  backend:
    servers: ["127.0.0.1:$BACKEND_PORT"]
limits:
  per_ip:
    key: ip
    rate: 100000000r/s
    burst: 1000
    nodelay: true
routes:
  - upstream: backend
    limits: [per_ip]
EOC
  taskset -c "$CPU" "$2" -c "$TMP/$1.yaml" --log-level warn 2>"$TMP/$1.log" &
  PID[$1]=$!
  PIDS+=($!)
  PORT[$1]=$p
  ready "$p"
}
NAMES=(now)
start now "$SG"
if [[ -n "$SG_BEFORE" ]]; then start before "$SG_BEFORE"; NAMES=(before now); fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK="$(getconf CLK_TCK)"
echo "| run | binary | req/s | CPU µs/req |"
echo "|---|---|---|---|"
for rep in $(seq "$REPS"); do
  for name in "${NAMES[@]}"; do
    c0="$(ticks "${PID[$name]}")"
    out="$(taskset -c "$CPU" h2load -n "$REQUESTS" -c "$CLIENTS" -m "$STREAMS" "http://127.0.0.1:${PORT[$name]}/" 2>&1)"
    c1="$(ticks "${PID[$name]}")"
    echo "$out" | grep -q "succeeded, 0 failed, 0 errored" || { echo "$out" >&2; exit 1; }
    rps="$(echo "$out" | awk '/^finished in/ {print $4}')"
    cpu="$(awk -v d=$((c1 - c0)) -v t="$TCK" -v n="$REQUESTS" 'BEGIN { printf "%.2f", d / t * 1e6 / n }')"
    echo "| $rep | $name | $rps | $cpu |"
  done
done
