#!/usr/bin/env bash
# Who goes first when there is not enough: one heavy client at ten times the load of nine
# light ones, in front of a backend of fixed capacity, through sluicegate with a queue,
# through sluicegate with a plain concurrency limit, and through nginx tuned as an nginx
# operator would.
#
#   benches/fairness/run.sh                 (from anywhere; needs cargo, curl; nginx where installed)
#
# The backend (examples/fairness.rs) completes CAPACITY / SERVICE_MS requests a second at
# most: SERVICE_MS each while at most CAPACITY are in progress, longer for everyone past
# that. The load (the same example) runs ten clients for DURATION seconds, each from its
# own loopback address (a distinct `ip` key): nine light ones at LIGHT_RATE requests a
# second, one heavy one at ten times that, an open loop (a slow answer does not slow a
# client), each request given up after 10 s. The defaults (50 slots of 20 ms: 2,500
# requests a second; light 9 × 200 = 1,800 a second, heavy 2,000) offer 1.5 times the
# capacity: the light clients alone fit in it.
#
# Cases, one after another, each against a fresh proxy:
#   queue   sluicegate: one concurrency limit of CAPACITY slots on the backend
#           (key: host) with `queue: { max: QUEUE_MAX, max_wait: MAX_WAIT, fair_by: ip }`
#   plain   sluicegate: the same limit without a queue (refused at once when full)
#   nginx   limit_conn of CAPACITY on the server (what nginx has for the backend's slots)
#           and limit_req per client address at a tenth of the capacity with a burst of
#           a second's worth, delayed (nginx's way to wait): each client's fair share, as
#           an operator sets it, since nginx cannot share spare capacity
# The table: per case, the light clients' success rate (200s of requests sent) and p99
# time to a 200, the heavy client's 200s a second and success rate, and all clients' 200s
# a second within the run (the goodput), against the backend's capacity as measured
# first: CAPACITY requests in progress at all times, straight to it, for 5 s (its timer's
# granularity makes it a few per cent below the nominal CAPACITY / SERVICE_MS).
#
#   DURATION [60]  CAPACITY [50]  SERVICE_MS [20]  LIGHT_RATE [200]
#   QUEUE_MAX [200]  MAX_WAIT [2s]  CASES ["queue plain nginx"]
#   SG  the sluicegate binary [target/release/sluicegate] (SKIP_BUILD=1: as it is)
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION="${DURATION:-60}"
CAPACITY="${CAPACITY:-50}"
SERVICE_MS="${SERVICE_MS:-20}"
LIGHT_RATE="${LIGHT_RATE:-200}"
QUEUE_MAX="${QUEUE_MAX:-200}"
MAX_WAIT="${MAX_WAIT:-2s}"
CASES="${CASES:-queue plain nginx}"
SG="${SG:-target/release/sluicegate}"
NEXT_PORT=23000

die() { echo "fairness: $*" >&2; exit 1; }
# The load holds a connection per request in progress: thousands while a proxy queues.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build --release --bin sluicegate --example fairness
fi
FAIR=target/release/examples/fairness
[ -x "$FAIR" ] || die "no $FAIR: cargo build --release --example fairness"

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { # first port >= NEXT_PORT on 127.0.0.1 that nothing answers on
  local p="$NEXT_PORT"
  while timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

wait_ready() { # poll until the port answers HTTP (bounded: 100 tries x 0.1 s)
  local port="$1" pid="$2" i
  for i in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || die "process $pid for port $port died while starting"
    if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$port/"; then return 0; fi
    sleep 0.1
  done
  die "nothing answering on 127.0.0.1:$port"
}

BACKEND_PORT="$(free_port)"; NEXT_PORT=$((BACKEND_PORT + 1))
"$FAIR" backend "127.0.0.1:$BACKEND_PORT" "$CAPACITY" "$SERVICE_MS" >"$tmp/backend.out" &
pids+=($!)
wait_ready "$BACKEND_PORT" "$!"
# Its real capacity: CAPACITY requests in progress at all times, straight to it.
measured="$("$FAIR" capacity "127.0.0.1:$BACKEND_PORT" 5 "$CAPACITY")"

sluicegate_conf() { # $1 port, $2 the limit's queue line (empty: none)
  cat <<EOF
listen: 127.0.0.1:$1
upstreams:
  backend: { servers: ["127.0.0.1:$BACKEND_PORT"], timeout: 30s }
limits:
  slots:
    key: host
    on_missing_key: shared
    concurrency: $CAPACITY
$2
routes:
  - { upstream: backend, limits: [slots] }
EOF
}

nginx_conf() { # $1 dir, $2 port
  local rate=$(( CAPACITY * 1000 / SERVICE_MS / 10 ))
  cat <<EOF
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path $1/body; proxy_temp_path $1/proxy; fastcgi_temp_path $1/fastcgi;
  uwsgi_temp_path $1/uwsgi; scgi_temp_path $1/scgi;
  limit_conn_zone \$server_name zone=slots:1m;
  limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=${rate}r/s;
  upstream backend { server 127.0.0.1:$BACKEND_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$2;
    location / {
      limit_conn slots $CAPACITY;
      limit_req zone=per_ip burst=$rate;
      limit_conn_status 429;
      limit_req_status 429;
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
}

capacity=$(( CAPACITY * 1000 / SERVICE_MS ))
echo "Backend: $CAPACITY slots of $SERVICE_MS ms ($capacity requests/s nominal, $measured measured with $CAPACITY in progress);"
echo "9 light clients at $LIGHT_RATE/s, 1 heavy at $((LIGHT_RATE * 10))/s; $DURATION s."
echo
echo "| case | light: 200s | light: p99 to a 200 | heavy: 200s/s | heavy: 200s | all: 200s/s (of capacity measured) |"
echo "|---|---:|---:|---:|---:|---:|"
row() { # $1 case, $2 the load's report
  python3 - "$1" "$2" "$measured" <<'PY'
import json, sys
case, report, capacity = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
light, heavy = report.get("light", {}), report.get("heavy", {})
pct = lambda c: 100.0 * (c.get("ok", 0) + c.get("late", 0)) / max(c.get("sent", 0), 1)
p99 = light.get("p99_ms")
p99 = "-" if p99 is None else f"{p99:.0f} ms"
total = light.get("ok_per_second", 0) + heavy.get("ok_per_second", 0)
print(f"| {case} | {pct(light):.1f} % | {p99} | {heavy.get('ok_per_second', 0):.0f} | {pct(heavy):.1f} % | "
      f"{total:.0f} ({100.0 * total / capacity:.0f} %) |")
PY
}
for case in $CASES; do
  port="$(free_port)"; NEXT_PORT=$((port + 1))
  case "$case" in
    queue | plain)
      queue=""
      [ "$case" = queue ] && queue="    queue: { max: $QUEUE_MAX, max_wait: $MAX_WAIT, fair_by: ip }"
      sluicegate_conf "$port" "$queue" >"$tmp/$case.yaml"
      "$SG" check -c "$tmp/$case.yaml" >/dev/null || die "sluicegate rejected $tmp/$case.yaml"
      "$SG" -c "$tmp/$case.yaml" --log-level warn 2>"$tmp/$case.log" &
      ;;
    nginx)
      command -v nginx >/dev/null || { echo "fairness: nginx is not installed: case nginx skipped" >&2; continue; }
      mkdir -p "$tmp/nginx"
      nginx_conf "$tmp/nginx" "$port" >"$tmp/nginx/nginx.conf"
      nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" 2>"$tmp/nginx.log" &
      ;;
    *) die "unknown case $case" ;;
  esac
  pid=$!
  pids+=("$pid")
  wait_ready "$port" "$pid"
  echo "fairness: $case, $DURATION s ..." >&2
  row "$case" "$("$FAIR" load "127.0.0.1:$port" "$DURATION" "$LIGHT_RATE")"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done

