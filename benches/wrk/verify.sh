#!/usr/bin/env bash
# Predict what wrk will see, run wrk, and check the run against the prediction:
# `sluicegate simulate --synthetic`, then `verify --snapshot`, wrk, `verify --since`.
#
#   benches/wrk/verify.sh                      both cases below
#   CASES=rejected benches/wrk/verify.sh       one of them
#
# (from anywhere; needs cargo, wrk and curl; run on purpose, not in CI)
#
# Cases, each a sluicegate in front of examples/bench_backend, wrk from 127.0.0.1 (one
# client address: keys=ip:1), with no warm-up, since the model starts every key fresh:
#   rejected   run.sh's `rejected` limit (key: ip, 10r/s, no burst): nearly every
#              request is refused; what is admitted is exact (1 + 10 a second), what
#              is refused depends on the machine's speed, which verify fits
#   delayed    key: ip, 500r/s, burst: 200 (delay mode): wrk's connections wait their
#              turn, so the rate sets how many requests are sent at all
#
# Environment (defaults in brackets): CONNECTIONS [64] THREADS [2] DURATION [10s]
# (whole seconds) SKIP_BUILD [0] (1: use target/release as it is) KEEP_TMP [0].
# Exit status: 0 when verify finds every case within its noise, 1 otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CASES="${CASES:-rejected delayed}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-2}"
DURATION="${DURATION:-10s}"
SKIP_BUILD="${SKIP_BUILD:-0}"
KEEP_TMP="${KEEP_TMP:-0}"
SG="$ROOT/target/release/sluicegate"
BACKEND_BIN="$ROOT/target/release/examples/bench_backend"

log() { printf '>> %s\n' "$*" >&2; }
die() { printf 'verify.sh: %s\n' "$*" >&2; exit 2; }

[[ "$DURATION" =~ ^[0-9]+s$ ]] || die "DURATION must be whole seconds, e.g. 10s (got $DURATION)"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
command -v curl >/dev/null || die "curl is needed"
if [[ "$SKIP_BUILD" != 1 ]]; then
  (cd "$ROOT" && cargo build --release --bin sluicegate --example bench_backend) || die "build failed"
fi

TMP="$(mktemp -d /tmp/sluicegate-verify.XXXXXX)"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ "$KEEP_TMP" == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

free_port() { # a port the kernel picks, released at once
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() { # $1 URL, $2 pid: bounded, 100 tries 0.1 s apart
  local i
  for i in $(seq 100); do
    kill -0 "$2" 2>/dev/null || die "process $2 died while starting"
    curl -s -o /dev/null --max-time 1 "$1" && return 0
    sleep 0.1
  done
  die "nothing answers $1"
}

BACKEND_PORT="$(free_port)"
"$BACKEND_BIN" "127.0.0.1:$BACKEND_PORT" >"$TMP/backend.log" 2>&1 &
PIDS+=("$!")
wait_http "http://127.0.0.1:$BACKEND_PORT/" "$!"

limit_of() {
  case "$1" in
    rejected) echo "{ key: ip, rate: 10r/s, status: 429 }" ;;
    delayed) echo "{ key: ip, rate: 500r/s, burst: 200 }" ;;
    *) die "unknown case $1 (rejected, delayed)" ;;
  esac
}

failed=0
for c in $CASES; do
  port="$(free_port)"
  admin="$(free_port)"
  conf="$TMP/$c.yaml"
  cat >"$conf" <<EOF
listen: 127.0.0.1:$port
admin: { listen: 127.0.0.1:$admin }
server: { shutdown_grace: 1s }
upstreams:
  backend: { servers: ["127.0.0.1:$BACKEND_PORT"] }
limits:
  per_ip: $(limit_of "$c")
routes:
  - name: all
    upstream: backend
    limits: [per_ip]
EOF
  "$SG" -c "$conf" --log-level warn 2>"$TMP/$c.log" &
  pid=$!
  PIDS+=("$pid")
  # Readiness on the admin listener: a request through the proxy would spend the key.
  wait_http "http://127.0.0.1:$admin/healthz" "$pid"
  spec="connections=$CONNECTIONS duration=$DURATION keys=ip:1 latency=100us"
  log "$c: sluicegate simulate --synthetic '$spec'"
  "$SG" simulate -c "$conf" --synthetic "$spec" | sed -n '1,/^route /p'
  "$SG" verify -c "$conf" --snapshot "$TMP/$c.before.json" >/dev/null
  log "$c: wrk -t$THREADS -c$CONNECTIONS -d$DURATION http://127.0.0.1:$port/"
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "http://127.0.0.1:$port/" | grep -E 'requests in|Requests/sec|Non-2xx'
  log "$c: sluicegate verify --since --duration $DURATION --synthetic '$spec'"
  if ! "$SG" verify -c "$conf" --since "$TMP/$c.before.json" --duration "$DURATION" --synthetic "$spec"; then
    failed=1
  fi
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
exit "$failed"
