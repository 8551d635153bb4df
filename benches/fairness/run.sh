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
#   global  two sluicegate instances sharing the queue's limit through a redis-server
#           (`scope: global`, started here; skipped without `redis-server`), the clients
#           split between them: light1, 3, 5, 7, 9 through the first, light2, 4, 6, 8 and
#           the heavy one through the second (not in CASES by default)
# The table: per case, the light clients' success rate (200s of requests sent) and p99
# time to a 200, the heavy client's 200s a second and success rate, and all clients' 200s
# a second within the run (the goodput), against the backend's capacity as measured
# first: CAPACITY requests in progress at all times, straight to it, for 5 s (its timer's
# granularity makes it a few per cent below the nominal CAPACITY / SERVICE_MS).
#
#
# Then, when the backend slows (a second table): the same clients at SLOW_RATE (light:
# 9 x 100 = 900 a second, heavy 1,000) and the backend's capacity halved at half time
# (`GET /capacity/N` on it), through sluicegate with the queue in two classes (gold: the
# light clients' addresses, bronze: the rest) in front of
#   adaptive  `concurrency: adaptive` (`adaptive: { min: 4, max: 200 }`, 500 ms windows)
#   fixed     `concurrency: CAPACITY`, as before
# Per phase (before and after the halving, by the second a request was sent): gold's
# success and p99, bronze's 200s a second, the most requests failed or timed out in one
# second (an error burst), and the adaptive ceiling (from /metrics, once a second): its
# value before, its value at the end, and how long after the halving it first came within
# 1.5 x the new capacity.
#
#   DURATION [60]  CAPACITY [50]  SERVICE_MS [20]  LIGHT_RATE [200]  SLOW_RATE [100]
#   QUEUE_MAX [200]  MAX_WAIT [2s]  CASES ["queue plain nginx"]  SLOW_CASES ["adaptive fixed"] (empty: none)
#   WINDOW [500ms]  the adaptive ceiling's window
#   SHED_AT  the backend answers 503 at once past SHED_AT x its capacity in progress (as
#            1.5; unset: it slows down instead)
#   SG  the sluicegate binary [target/release/sluicegate] (SKIP_BUILD=1: as it is)
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION="${DURATION:-60}"
CAPACITY="${CAPACITY:-50}"
SERVICE_MS="${SERVICE_MS:-20}"
LIGHT_RATE="${LIGHT_RATE:-200}"
QUEUE_MAX="${QUEUE_MAX:-200}"
MAX_WAIT="${MAX_WAIT:-2s}"
CASES="${CASES-queue plain nginx}"
SLOW_CASES="${SLOW_CASES-adaptive fixed}"
SLOW_RATE="${SLOW_RATE:-100}"
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

# free_port, wait_ready
. benches/lib.sh

BACKEND_PORT="$(free_port)"; NEXT_PORT=$((BACKEND_PORT + 1))
"$FAIR" backend "127.0.0.1:$BACKEND_PORT" "$CAPACITY" "$SERVICE_MS" ${SHED_AT:+"$SHED_AT"} >"$tmp/backend.out" &
pids+=($!)
wait_ready "$BACKEND_PORT" "$!"
# Its real capacity: CAPACITY requests in progress at all times, straight to it.
measured="$("$FAIR" capacity "127.0.0.1:$BACKEND_PORT" 5 "$CAPACITY")"

sluicegate_conf() { # $1 port, $2 the limit's queue line (empty: none), $3 concurrency [CAPACITY], $4 more
  cat <<EOF
listen: 127.0.0.1:$1
upstreams:
  backend: { servers: ["127.0.0.1:$BACKEND_PORT"], timeout: 30s }
limits:
  slots:
    key: host
    on_missing_key: shared
    concurrency: ${3:-$CAPACITY}
$2
routes:
  - { upstream: backend, limits: [slots] }
${4:-}
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
  targets="127.0.0.1:$port"
  case "$case" in
    queue | plain)
      queue=""
      [ "$case" = queue ] && queue="    queue: { max: $QUEUE_MAX, max_wait: $MAX_WAIT, fair_by: ip }"
      sluicegate_conf "$port" "$queue" >"$tmp/$case.yaml"
      "$SG" check -c "$tmp/$case.yaml" >/dev/null || die "sluicegate rejected $tmp/$case.yaml"
      "$SG" -c "$tmp/$case.yaml" --log-level warn 2>"$tmp/$case.log" &
      ;;
    global)
      command -v redis-server >/dev/null || { echo "fairness: redis-server is not installed: case global skipped" >&2; continue; }
      rport="$(free_port)"; NEXT_PORT=$((rport + 1))
      redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >"$tmp/redis.log" 2>&1 &
      pids+=($!)
      for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
      second="$(free_port)"; NEXT_PORT=$((second + 1))
      shared="    scope: global
    on_store_error: local
    instances: 2
    queue: { max: $QUEUE_MAX, max_wait: $MAX_WAIT, fair_by: ip }"
      sluicegate_conf "$second" "$shared" "" "redis: { url: \"redis://127.0.0.1:$rport\" }" >"$tmp/global-2.yaml"
      "$SG" -c "$tmp/global-2.yaml" --log-level warn 2>"$tmp/global-2.log" &
      pids+=($!)
      wait_ready "$second" "$!"
      targets="127.0.0.1:$port,127.0.0.1:$second"
      sluicegate_conf "$port" "$shared" "" "redis: { url: \"redis://127.0.0.1:$rport\" }" >"$tmp/global.yaml"
      "$SG" check -c "$tmp/global.yaml" >/dev/null || die "sluicegate rejected $tmp/global.yaml"
      "$SG" -c "$tmp/global.yaml" --log-level warn 2>"$tmp/global.log" &
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
  row "$case" "$("$FAIR" load "$targets" "$DURATION" "$LIGHT_RATE")"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done

[ -n "$SLOW_CASES" ] || exit 0
half=$(( CAPACITY / 2 ))
split=$(( DURATION / 2 ))
echo
echo "When the backend slows: $CAPACITY slots, $half from $split s on; 9 light clients (gold) at $SLOW_RATE/s,"
echo "1 heavy (bronze) at $((SLOW_RATE * 10))/s; $DURATION s."
echo
echo "| case | gold: 200s, before / after | gold: p99, before / after | bronze: 200s/s, before / after | worst second: failed | ceiling: before, at the end, within 1.5 × $half after |"
echo "|---|---:|---:|---:|---:|---:|"
slow_row() { # $1 case, $2 the load's report, $3 the ceiling's samples (one "second value" a line)
  python3 - "$1" "$2" "$3" "$split" "$half" <<'PY'
import json, sys
case, report, samples, split, half = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
gold, bronze = report.get("light", {}), report.get("heavy", {})
pct = lambda c: 100.0 * (c.get("ok", 0) + c.get("late", 0)) / max(c.get("sent", 0), 1)
ms = lambda v: "-" if v is None else f"{v:.0f} ms"
g, b = gold.get("phases", [{}, {}]), bronze.get("phases", [{}, {}])
worst = max(gold.get("worst_second", 0), bronze.get("worst_second", 0))
ceiling = "-"
points = [tuple(map(float, l.split())) for l in samples.splitlines() if l.strip()]
before = [v for t, v in points if t < split]
if before:
    follow = next((t - split for t, v in points if t >= split and v <= 1.5 * half), None)
    follow = "not within the run" if follow is None else f"{follow:.1f} s"
    ceiling = f"{before[-1]:.0f}, {points[-1][1]:.0f}, {follow}"
print(f"| {case} | {pct(g[0]):.1f} % / {pct(g[1]):.1f} % | {ms(g[0].get('p99_ms'))} / {ms(g[1].get('p99_ms'))} | "
      f"{b[0].get('ok_per_second', 0):.0f} / {b[1].get('ok_per_second', 0):.0f} | {worst} | {ceiling} |")
PY
}
classes='[{ name: gold, match: { cidrs: [127.0.0.8/29, 127.0.0.16/30] } }, { name: bronze }]'
for case in $SLOW_CASES; do
  port="$(free_port)"; NEXT_PORT=$((port + 1))
  admin="$(free_port)"; NEXT_PORT=$((admin + 1))
  queue="    queue: { max: $QUEUE_MAX, max_wait: $MAX_WAIT, fair_by: ip, classes: $classes }"
  case "$case" in
    adaptive) sluicegate_conf "$port" "    adaptive: { min: 4, max: 200, window: ${WINDOW:-500ms} }
$queue" adaptive "admin: { listen: 127.0.0.1:$admin }" >"$tmp/$case.yaml" ;;
    fixed) sluicegate_conf "$port" "$queue" "$CAPACITY" "admin: { listen: 127.0.0.1:$admin }" >"$tmp/$case.yaml" ;;
    *) die "unknown slow case $case" ;;
  esac
  "$SG" check -c "$tmp/$case.yaml" >/dev/null || die "sluicegate rejected $tmp/$case.yaml"
  "$SG" -c "$tmp/$case.yaml" --log-level warn 2>"$tmp/$case.log" &
  pid=$!
  pids+=("$pid")
  wait_ready "$port" "$pid"
  curl -s -o /dev/null "http://127.0.0.1:$BACKEND_PORT/capacity/$CAPACITY"
  echo "fairness: $case (the backend slows at $split s), $DURATION s ..." >&2
  "$FAIR" load "127.0.0.1:$port" "$DURATION" "$SLOW_RATE" 10000 "$split" >"$tmp/$case.json" &
  load=$!
  : >"$tmp/$case.ceiling"
  begun="$(date +%s.%N)"
  slowed=""
  for _ in $(seq 0 "$DURATION"); do
    now="$(awk -v b="$begun" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - b }')"
    if [ -z "$slowed" ] && awk -v n="$now" -v s="$split" 'BEGIN { exit !(n >= s) }'; then
      curl -s -o /dev/null "http://127.0.0.1:$BACKEND_PORT/capacity/$half"
      slowed=1
    fi
    value="$(curl -s --max-time 1 "http://127.0.0.1:$admin/metrics" | awk '/^sluicegate_limit_ceiling\{/ { print $2 }')"
    [ -n "$value" ] && echo "$now $value" >>"$tmp/$case.ceiling"
    sleep 1
  done
  wait "$load"
  echo "fairness: $case: the ceiling (seconds since the load began, value): $(tr '\n' ' ' <"$tmp/$case.ceiling")" >&2
  slow_row "$case" "$(cat "$tmp/$case.json")" "$(cat "$tmp/$case.ceiling")"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done
