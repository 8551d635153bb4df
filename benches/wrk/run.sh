#!/usr/bin/env bash
# Whole-proxy load test: sluicegate beside nginx (and HAProxy) in front of the same backend.
#
#   benches/wrk/run.sh                          multi-core layout (below)
#   LAYOUT=onecore benches/wrk/run.sh           everything pinned to one CPU (below)
#   LAYOUT=instructions benches/wrk/run.sh      instructions per request under callgrind
#   LAYOUT=memory benches/wrk/run.sh            memory per connection, beside nginx
#   LAYOUT=workers benches/wrk/run.sh           CPU per request as workers are added, beside nginx
#
# (from anywhere; needs cargo, wrk, curl; nginx, HAProxy, valgrind, redis-server where used)
#
# LAYOUT=onecore: wrk -t1, the backend (examples/bench_backend.rs: hyper on a
# current-thread runtime, so nginx is only ever a peer) and each proxy (one worker:
# `server.workers: 1`, nginx `worker_processes 1`, HAProxy `nbthread 1`) all pinned with
# taskset to CPU $CPU, so they take turns on it as on a saturated core and no proxy gains
# from spare cores. Every process is started once; the measured runs are interleaved
# (repetition 1 of every case and proxy, then repetition 2, ...) so that a drift of the
# machine touches all alike. Per case and proxy the table gives medians over the
# repetitions of: req/s; req/s over the backend-direct run of the same repetition; req/s
# over nginx's run of the same case and repetition; p99; and the proxy's CPU time per
# request (utime+stime from /proc/PID/stat, children included), also over nginx's. It
# ends with a markdown table ready for docs/performance.md. Cases (CASES, space-separated, default
# all five; global only where redis-server is installed):
#   forwarded    a limit that never rejects (sluicegate limit, nginx limit_req)
#   rejected     a limit that rejects every request with 429
#   concurrency  8 requests in progress per client address, of 64 connections (limit_conn)
#   plain        no limit at all (HAProxy here too)
#   global       forwarded's limit with scope: global, against a redis-server pinned to the
#                same CPU (no peer: nginx has no shared limit); the report adds its req/s
#                over forwarded's, and Redis's CPU per request beside the proxy's
# Rejections are logged at the limit's default level (info), below --log-level warn, as
# nginx's limit_req_log_level info is below its error_log warn: logging off on both sides.
#   REPS [3]  repetitions        CPU [0]  the CPU everything is pinned to
#   DURATION here defaults to 8s, WARMUP to 1s, THREADS to 1
#   PEERS ["nginx haproxy"]  peers to run when installed (empty: sluicegate alone)
#   BACKEND_PORT  use a backend already listening there instead of starting one
#   SG  the sluicegate binary [target/dist/sluicegate: `cargo build --profile dist --no-default-features`, the
#       build to install] (SKIP_BUILD=1: use it as is)
#   ADMIN [0]  1: sluicegate with an admin listener too (its dashboard records history
#              once a second, and each limit counts the keys it refuses)
#   CANDIDATE [0]  1 (with ADMIN=1, LAYOUT=instructions): a candidate live beside
#              sluicegate's configuration, a copy of it (`POST /candidate`): each request
#              decided twice, the second decision tallied and logged only
#
# LAYOUT=instructions: each proxy (sluicegate with `server.workers: 1`, nginx with one
# worker) runs under `valgrind --tool=callgrind` with the backend; after a warm-up the
# counters are zeroed, examples/bench_client.rs sends exactly REQUESTS [20000] requests
# over CONNECTIONS_IR [8] keep-alive connections, and the instructions the proxy executed
# divided by REQUESTS are its cost per request: a figure that does not move with the load
# of the machine. KEEP_TMP=1 keeps the callgrind files for callgrind_annotate. The cases
# are onecore's (CASES); `global` uses a redis-server outside callgrind. Two more cases here
# only (no peer has them), each request with the same bearer token (a signed JWT):
#   bearer       forwarded's limit keyed on the bearer token
#   jwt          forwarded's limit keyed on the token's verified `sub` (jwt:sub, HS256)
# and two that POST a 1 KiB JSON body ({"model":"bench",...}, X-Model: bench):
#   header_body  forwarded's limit keyed on the header X-Model
#   json_body    forwarded's limit keyed on the body's field (json:model), read before
#                the admission
#
# LAYOUT=memory: each proxy (sluicegate with `server.workers: 1`, nginx with one worker),
# a fresh process per case, after one request through it; examples/hold_connections.rs
# opens HOLD [6000] connections and holds them in one state: `idle` (connected, nothing
# sent), `kept` (one GET answered, kept alive), `h2` (HTTP/2 preface and SETTINGS, no
# stream; sluicegate only), `busy` (GET /held sent, which the backend never answers: a
# request in progress, its upstream connection included). The proxy's resident memory
# (VmRSS, workers included) with them open, less before, divided by HOLD, is what a
# connection costs it.
#
# LAYOUT=workers: the multi-core layout's forwarded case (sluicegate's limit that never
# rejects, nginx's limit_req) with each proxy at every worker count of WORKERS ["1 2 4"]
# (sluicegate `server.workers`, nginx `worker_processes`), all started at once and measured
# interleaved, REPS [3] times: medians of req/s and of CPU per request, each over nginx's
# with as many workers and over the proxy's own with one. With more workers than cores the
# workers contend for them (what more workers would cost on a larger machine, roughly).
#
# Multi-core layout (the default), all in one run so the ratios are comparable:
#   a  backend direct (baseline)
#   b  sluicegate, no limits
#   c  sluicegate, a limit that never rejects (key: ip, 100000000r/s, burst 1000, nodelay)
#   d  nginx reverse proxy, limit_req that never rejects, upstream keepalive,
#      with worker_processes 1 and with worker_processes auto
#   e  sluicegate, a limit that rejects almost everything (key: ip, 10r/s): the 429 path
#   f  nginx, the same 429 case (limit_req_status 429), workers 1 and auto
#   g  sluicegate, case c's limit with scope: global, against a local redis-server
#   h  sluicegate, case e's limit with scope: global (the near-cache answers most 429s)
#   For g and h the table adds Redis script calls (EVALSHA) per request, measured run only.
#
# Everything listens on 127.0.0.1 only. Everything started here is killed on exit.
# wrk, the backend and the proxy under test share the machine's cores; sluicegate runs one
# worker per core (server.workers unset; SG_WORKERS=N sets it), hence nginx is also run
# with worker_processes auto.
#
# Environment overrides (defaults in brackets):
#   DURATION [10s]   measured wrk run per case     WARMUP [2s]   unmeasured wrk run before it
#   CONNECTIONS [64] wrk -c                        THREADS [2]   wrk -t
#   WRK_TIMEOUT [2s] wrk --timeout                 BASE_PORT [18480] first port tried
#   SKIP_BUILD [0]   1: use the existing $SG and target/release/examples
#   KEEP_TMP [0]     1: keep the temp dir (configs, logs, raw wrk output)
#
# report.lua turns each wrk run into one parsable line; status.lua (not used by this
# script) counts responses by status code when a case shows unexpected non-2xx.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LAYOUT="${LAYOUT:-multicore}"
if [[ "$LAYOUT" == onecore ]]; then
  DURATION="${DURATION:-8s}"
  WARMUP="${WARMUP:-1s}"
  THREADS="${THREADS:-1}"
fi
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-2s}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-2}"
WRK_TIMEOUT="${WRK_TIMEOUT:-2s}"
BASE_PORT="${BASE_PORT:-18480}"
SKIP_BUILD="${SKIP_BUILD:-0}"
KEEP_TMP="${KEEP_TMP:-0}"
SG="${SG:-$ROOT/target/dist/sluicegate}"
BACKEND_BIN="$ROOT/target/release/examples/bench_backend"
CLIENT_BIN="$ROOT/target/release/examples/bench_client"
HOLD_BIN="$ROOT/target/release/examples/hold_connections"
HOLD="${HOLD:-6000}"
NGX_CONNECTIONS=4096 # nginx's worker_connections
# nginx at its best: an upstream keepalive at least wrk's concurrency (nginx's fixed cap
# below it would close and reopen a connection per request). sluicegate runs on its
# defaults: its pool keeps what the load needs.
NGX_KEEPALIVE=$(( CONNECTIONS > 64 ? CONNECTIONS : 64 ))
SG_WORKERS="${SG_WORKERS:-}" # server.workers of the sluicegate configs ("": one per core)
SG_MAX_CONNECTIONS="" # server.max_connections of the sluicegate configs ("": the default)
PIN=()             # the command prefix that pins a process (onecore: taskset)

log() { printf '>> %s\n' "$*" >&2; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

secs_of() { # "10s" | "10" -> 10 (wrk also accepts m/h, which this bound does not need)
  local d="${1%s}"
  [[ "$d" =~ ^[0-9]+$ ]] || die "durations must be whole seconds (got $1)"
  echo "$d"
}
DUR_S="$(secs_of "$DURATION")"
WARM_S="$(secs_of "$WARMUP")"

case "$LAYOUT" in
  multicore | onecore | instructions | memory | workers) ;;
  *) die "LAYOUT must be multicore, onecore, instructions, memory or workers (got $LAYOUT)" ;;
esac

# ---- tools ---------------------------------------------------------------------------
if [[ "$LAYOUT" == multicore || "$LAYOUT" == workers ]] && ! command -v nginx >/dev/null || ! command -v wrk >/dev/null || ! command -v redis-server >/dev/null; then
  [[ $(id -u) -eq 0 ]] || die "nginx, wrk and redis-server are needed (apt-get install nginx wrk redis-server)"
  log "installing nginx, wrk and redis-server"
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx wrk redis-server
fi
command -v curl >/dev/null || die "curl is needed"
command -v wrk >/dev/null || [[ "$LAYOUT" == instructions || "$LAYOUT" == memory ]] || die "wrk is needed (apt-get install wrk)"

# ---- processes and cleanup -------------------------------------------------------------
TMP="$(mktemp -d /tmp/sluicegate-wrk.XXXXXX)"
chmod 755 "$TMP" # nginx workers run as nobody when started by root
PIDS=()

stop_pid() { # TERM, wait up to 5 s, then KILL
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  if [[ "$KEEP_TMP" == 1 ]]; then
    log "kept $TMP"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget_pid() { # drop a stopped pid from PIDS
  local keep=() p
  for p in "${PIDS[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

NEXT_PORT="$BASE_PORT"
# free_port, wait_ready
. "$HERE/../lib.sh"

# ---- nginx configs -------------------------------------------------------------------------
nginx_common() { # $1 prefix dir, $2 workers
  cat <<EOF
worker_processes $2;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections $NGX_CONNECTIONS; }
EOF
}

nginx_http_common() { # $1 prefix dir
  cat <<EOF
  access_log off;
  client_body_temp_path $1/body;
  proxy_temp_path $1/proxy;
  fastcgi_temp_path $1/fastcgi;
  uwsgi_temp_path $1/uwsgi;
  scgi_temp_path $1/scgi;
  keepalive_requests 1000000000;
  keepalive_timeout 75s;
EOF
}

write_backend_conf() { # $1 dir, $2 port
  {
    nginx_common "$1" 1
    echo "http {"
    nginx_http_common "$1"
    cat <<EOF
  server {
    listen 127.0.0.1:$2;
    location / { default_type text/plain; return 200 "ok\n"; }
  }
}
EOF
  } >"$1/nginx.conf"
}

write_nginx_proxy_conf() { # $1 dir, $2 port, $3 workers, $4 rate, $5 limit_req args
  write_nginx_conf "$1" "$2" "$3" "limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=$4;" \
    "limit_req zone=per_ip $5;
      limit_req_status 429;
      limit_req_log_level info;   # rejections below the error_log level, like sluicegate --log-level warn"
}

write_nginx_conf() { # $1 dir, $2 port, $3 workers, $4 http-level lines, $5 location lines
  {
    nginx_common "$1" "$3"
    echo "http {"
    nginx_http_common "$1"
    cat <<EOF
  $4
  upstream backend {
    server 127.0.0.1:$BACKEND_PORT;
    keepalive $NGX_KEEPALIVE;
    keepalive_requests 1000000000;
  }
  server {
    listen 127.0.0.1:$2;
    location / {
      $5
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$host;
    }
  }
}
EOF
  } >"$1/nginx.conf"
}

START_PID=""
start_nginx() { # $1 dir, $2 port; sets START_PID
  mkdir -p "$1"
  nginx -t -q -e "$1/error.log" -p "$1" -c "$1/nginx.conf" || die "bad nginx config $1/nginx.conf"
  "${PIN[@]}" nginx -e "$1/error.log" -p "$1" -c "$1/nginx.conf" 2>>"$1/error.log" &
  START_PID=$!
  PIDS+=("$START_PID")
  wait_ready "$2" "$START_PID"
}

# ---- sluicegate configs ----------------------------------------------------------------------
write_sg_conf() { # $1 file, $2 port, $3 limit yaml ("" for none), $4 more top-level yaml
  local admin=""
  if [[ "${ADMIN:-0}" == 1 ]]; then
    # free_port runs in a subshell: what it takes is skipped here by hand.
    NEXT_PORT=$(($2 + 1))
    admin="$(free_port)"
    NEXT_PORT=$((admin + 1))
  fi
  {
    cat <<EOF
listen: 127.0.0.1:$2
server:
  shutdown_grace: 1s
EOF
    [[ -z "$SG_WORKERS" ]] || echo "  workers: $SG_WORKERS"
    [[ -z "$SG_MAX_CONNECTIONS" ]] || echo "  max_connections: $SG_MAX_CONNECTIONS"
    [[ -z "$admin" ]] || echo "admin: { listen: \"127.0.0.1:$admin\" }"
    # The pool on its defaults (as a user who writes nothing gets it).
    cat <<EOF
upstreams:
  backend:
    servers: ["127.0.0.1:$BACKEND_PORT"]
EOF
    [[ -z "${4:-}" ]] || printf '%s\n' "$4"
    if [[ -n "$3" ]]; then
      printf 'limits:\n  per_ip:\n%s\n' "$3"
      printf 'routes:\n  - upstream: backend\n    limits: [per_ip]\n'
    else
      printf 'routes:\n  - upstream: backend\n'
    fi
  } >"$1"
  "$SG" check -c "$1" >/dev/null || die "sluicegate rejected $1"
  SG_ADMIN_PORT="$admin"
  # The candidate: a copy beside it (a file of its own, in its directory).
  [[ "${CANDIDATE:-0}" != 1 ]] || cp "$1" "${1%.yaml}.candidate.yaml"
}

# With CANDIDATE=1, puts the copy of config $1 live beside it as a candidate.
load_candidate() { # $1 config
  [[ "${CANDIDATE:-0}" == 1 ]] || return 0
  [[ -n "$SG_ADMIN_PORT" ]] || die "CANDIDATE=1 needs ADMIN=1 (the candidate is loaded through the admin API)"
  curl -sf -X POST "http://127.0.0.1:$SG_ADMIN_PORT/candidate?file=${1%.yaml}.candidate.yaml" >/dev/null ||
    die "the candidate of $1 was not loaded"
}

start_sg() { # $1 config, $2 port, $3 log file; sets START_PID
  "${PIN[@]}" "$SG" -c "$1" --log-level warn 2>"$3" &
  START_PID=$!
  PIDS+=("$START_PID")
  wait_ready "$2" "$START_PID"
}

stop_started() { stop_pid "$1"; forget_pid "$1"; }

# ---- measuring ------------------------------------------------------------------------------
CLK_TCK="$(getconf CLK_TCK)"
cpu_ticks() { # utime+stime of a process and its direct children (nginx workers)
  local total=0 p f
  for p in "$1" $(pgrep -P "$1" || true); do
    if f=$(cat "/proc/$p/stat" 2>/dev/null); then
      f="${f##*) }" # fields after "(comm) "; utime/stime are fields 14/15, here 12/13
      read -r -a a <<<"$f"
      total=$((total + a[11] + a[12]))
    fi
  done
  echo "$total"
}

LABELS=()
declare -A RPS P50 P99 NON2XX SOCKERR CPU CPUREQ CODES RCMD
REDIS_PORT=""      # set while a case uses Redis: its commands per request are measured

# Starts a redis-server (no persistence; pinned like the rest where the layout pins);
# sets REDIS_PORT, REDIS_PID and REDIS_YAML (the `redis:` section that uses it).
start_redis() {
  command -v redis-server >/dev/null || die "global cases need redis-server (apt-get install redis-server)"
  REDIS_PORT="$(free_port)"
  "${PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --logfile "$TMP/redis.log" >/dev/null 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  REDIS_YAML="redis: { url: \"redis://127.0.0.1:$REDIS_PORT\", timeout: 50ms }"
}

# Script calls Redis ran (the commands a script runs inside count separately, not here).
redis_calls() { redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[:=,]' '/^cmdstat_evalsha:/ {print $3+0}'; }

run_case() { # $1 label, $2 port, $3 pid whose CPU (with children) is the thing under test
  local label="$1" port="$2" pid="$3" out t0 t1 line
  CODES[$label]="$(for _ in 1 2 3; do curl -s -o /dev/null -w '%{http_code} ' --max-time 2 "http://127.0.0.1:$port/"; done)"
  log "$label: warm-up ${WARMUP}, then wrk -t$THREADS -c$CONNECTIONS -d$DURATION (pre-check status codes: ${CODES[$label]})"
  timeout $((WARM_S + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"$WARMUP" --timeout "$WRK_TIMEOUT" \
    "http://127.0.0.1:$port/" >/dev/null
  out="$TMP/wrk-${label//[^A-Za-z0-9_.-]/_}.txt"
  local r0=""
  [[ -z "$REDIS_PORT" ]] || r0="$(redis_calls)"
  t0="$(cpu_ticks "$pid")"
  timeout $((DUR_S + 30)) wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --timeout "$WRK_TIMEOUT" \
    --latency -s "$HERE/report.lua" "http://127.0.0.1:$port/" >"$out"
  t1="$(cpu_ticks "$pid")"
  local r1=""
  [[ -z "$REDIS_PORT" ]] || r1="$(redis_calls)"
  line="$(grep '^WRKRESULT ' "$out")" || die "no result from wrk for $label (see $out)"
  local rps requests p50_us p99_us non2xx connect read write timeout secs kv
  for kv in ${line#WRKRESULT }; do local "${kv%%=*}=${kv#*=}"; done
  LABELS+=("$label")
  RPS[$label]="$rps"
  P50[$label]="$p50_us"
  P99[$label]="$p99_us"
  NON2XX[$label]="$non2xx"
  SOCKERR[$label]="$connect/$read/$write/$timeout"
  CPU[$label]="$(awk -v d=$((t1 - t0)) -v hz="$CLK_TCK" -v s="$secs" 'BEGIN{printf "%.0f", 100*d/hz/s}')"
  RCMD[$label]="-"
  [[ -z "$r0" ]] || RCMD[$label]="$(awk -v d=$((r1 - r0)) -v n="$requests" 'BEGIN{printf "%.3f", n ? d/n : 0}')"
  CPUREQ[$label]="$(awk -v d=$((t1 - t0)) -v hz="$CLK_TCK" -v n="$requests" 'BEGIN{printf "%.1f", n ? 1e6*d/hz/n : 0}')"
  log "$label: $rps req/s, p50 ${p50_us}us, p99 ${p99_us}us, non-2xx $non2xx, socket errors c/r/w/t ${SOCKERR[$label]}"
}

# ---- LAYOUT=onecore and LAYOUT=instructions ---------------------------------------------------
CASES="${CASES:-forwarded rejected concurrency plain$(command -v redis-server >/dev/null && echo " global")}"
REPS="${REPS:-3}"
CPU="${CPU:-0}"
PEERS="${PEERS-nginx haproxy}"
REQUESTS="${REQUESTS:-20000}"

has_peer() { [[ " $PEERS " == *" $1 "* ]] && command -v "$1" >/dev/null; }

start_backend() { # sets BACKEND_PORT and BACKEND_PID (none when BACKEND_PORT was given)
  BACKEND_PID=""
  if [[ -n "${BACKEND_PORT:-}" ]]; then
    log "backend: the one already on 127.0.0.1:$BACKEND_PORT"
    return
  fi
  [[ -x "$BACKEND_BIN" ]] || die "no $BACKEND_BIN (cargo build --release --example bench_backend)"
  BACKEND_PORT="$(free_port)"
  "${PIN[@]}" "$BACKEND_BIN" "127.0.0.1:$BACKEND_PORT" >"$TMP/backend.log" 2>&1 &
  BACKEND_PID=$!
  PIDS+=("$BACKEND_PID")
  wait_ready "$BACKEND_PORT" "$BACKEND_PID"
  log "backend examples/bench_backend on 127.0.0.1:$BACKEND_PORT"
}

LIMIT_CONC="    key: ip
    concurrency: 8"
# The sluicegate limit (yaml) and the nginx directives (http level | location level) of a case.
sg_limit() {
  case "$1" in
    forwarded) echo "$LIMIT_PASS" ;;
    rejected) echo "$LIMIT_REJECT" ;;
    concurrency) echo "$LIMIT_CONC" ;;
    plain) echo "" ;;
    global) printf '%s\n    scope: global\n' "$LIMIT_PASS" ;;
    # Every request over a soft limit: forwarded with RateLimit-Exceeded and its item.
    annotated) printf '%s\n    action: annotate\n' "$LIMIT_REJECT" ;;
    bearer) echo "${LIMIT_PASS/key: ip/key: bearer}" ;;
    jwt) echo "${LIMIT_PASS/key: ip/key: \"jwt:sub\"}" ;;
    header_body) printf '%s\n    on_missing_key: refuse\n' "${LIMIT_PASS/key: ip/key: \"header:x-model\"}" ;;
    json_body) printf '%s\n    on_missing_key: refuse\n' "${LIMIT_PASS/key: ip/key: \"json:model\"}" ;;
  esac
}
# What a case adds at the top level of sluicegate's file.
sg_top() {
  case "$1" in
    global) echo "$REDIS_YAML" ;;
    jwt) echo "jwt: { secret: \"$JWT_SECRET\" }" ;;
  esac
}
# A token of `{"sub": "bench-user", "exp": 4102444800}` signed (HS256) with JWT_SECRET.
JWT_SECRET="bench-secret-of-at-least-32-bytes!"
JWT_TOKEN="eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJiZW5jaC11c2VyIiwiZXhwIjo0MTAyNDQ0ODAwfQ.bt4kRAG8i4HG9VJ5gd65pmKJ_qbV8voCa6yjvKuexKo"
ng_http() {
  case "$1" in
    forwarded) echo "limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=100000000r/s;" ;;
    rejected) echo "limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=10r/s;" ;;
    concurrency) echo "limit_conn_zone \$binary_remote_addr zone=per_ip:10m;" ;;
    plain) echo "" ;;
  esac
}
ng_location() {
  local log="limit_req_log_level info;   # rejections below error_log warn, like sluicegate --log-level warn"
  case "$1" in
    forwarded) echo "limit_req zone=per_ip burst=1000 nodelay; limit_req_status 429; $log" ;;
    rejected) echo "limit_req zone=per_ip nodelay; limit_req_status 429; $log" ;;
    concurrency) echo "limit_conn per_ip 8; limit_conn_status 429; limit_conn_log_level info;" ;;
    plain) echo "" ;;
  esac
}

write_haproxy_conf() { # $1 file, $2 port
  cat >"$1" <<EOF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  option forwardfor
  http-reuse always
frontend fe
  bind 127.0.0.1:$2
  default_backend be
backend be
  server s1 127.0.0.1:$BACKEND_PORT
EOF
}

declare -A TARGET_PORT TARGET_PID # by "case/proxy"
ROWS=()                            # "case/proxy" in table order

# Starts every proxy of every case once (pinned); registers the rows.
start_targets() {
  local c port tag dir
  ROWS+=("direct/backend")
  TARGET_PORT["direct/backend"]="$BACKEND_PORT"
  TARGET_PID["direct/backend"]="$BACKEND_PID"
  for c in $CASES; do
    tag="$c"
    [[ "$c" != global ]] || start_redis
    port="$(free_port)"
    write_sg_conf "$TMP/sg-$tag.yaml" "$port" "$(sg_limit "$c")" "$(sg_top "$c")"
    start_sg "$TMP/sg-$tag.yaml" "$port" "$TMP/sg-$tag.log"
    ROWS+=("$c/sluicegate")
    TARGET_PORT["$c/sluicegate"]="$port"
    TARGET_PID["$c/sluicegate"]="$START_PID"
    if [[ "$c" != global ]] && has_peer nginx; then
      port="$(free_port)"
      dir="$TMP/nginx-$tag"
      mkdir -p "$dir"
      write_nginx_conf "$dir" "$port" 1 "$(ng_http "$c")" "$(ng_location "$c")"
      start_nginx "$dir" "$port"
      ROWS+=("$c/nginx")
      TARGET_PORT["$c/nginx"]="$port"
      TARGET_PID["$c/nginx"]="$START_PID"
    fi
    if [[ "$c" == plain ]] && has_peer haproxy; then
      port="$(free_port)"
      write_haproxy_conf "$TMP/haproxy.cfg" "$port"
      haproxy -c -q -f "$TMP/haproxy.cfg" || die "bad HAProxy config $TMP/haproxy.cfg"
      "${PIN[@]}" haproxy -db -f "$TMP/haproxy.cfg" >"$TMP/haproxy.log" 2>&1 &
      START_PID=$!
      PIDS+=("$START_PID")
      wait_ready "$port" "$START_PID"
      ROWS+=("$c/haproxy")
      TARGET_PORT["$c/haproxy"]="$port"
      TARGET_PID["$c/haproxy"]="$START_PID"
    fi
  done
}

declare -A M_RPS M_P99 M_CPUREQ M_NON2XX M_REDISCPU M_CONNS # by "case/proxy/rep"

measure() { # $1 row, $2 rep
  local row="$1" rep="$2" port="${TARGET_PORT[$1]}" pid="${TARGET_PID[$1]}" out t0=0 t1=0 r0=0 r1=0 line
  if [[ "$WARM_S" -gt 0 ]]; then
    timeout $((WARM_S + 30)) "${PIN[@]}" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$WARMUP" --timeout "$WRK_TIMEOUT" \
      "http://127.0.0.1:$port/" >/dev/null
  fi
  out="$TMP/wrk-${row//\//-}-$rep.txt"
  [[ -z "$pid" ]] || t0="$(cpu_ticks "$pid")"
  [[ "$row" != global/* ]] || r0="$(cpu_ticks "$REDIS_PID")"
  local a0="" a1=""
  [[ -z "$BACKEND_PID" ]] || a0="$(accepted)"
  timeout $((DUR_S + 30)) "${PIN[@]}" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --timeout "$WRK_TIMEOUT" \
    --latency -s "$HERE/report.lua" "http://127.0.0.1:$port/" >"$out"
  [[ -z "$pid" ]] || t1="$(cpu_ticks "$pid")"
  [[ "$row" != global/* ]] || r1="$(cpu_ticks "$REDIS_PID")"
  [[ -z "$BACKEND_PID" ]] || a1="$(accepted)"
  line="$(grep '^WRKRESULT ' "$out")" || die "no result from wrk for $row (see $out)"
  local rps requests p50_us p99_us non2xx connect read write timeout secs kv
  for kv in ${line#WRKRESULT }; do local "${kv%%=*}=${kv#*=}"; done
  M_RPS["$row/$rep"]="$rps"
  M_P99["$row/$rep"]="$p99_us"
  M_NON2XX["$row/$rep"]="$non2xx"
  M_CPUREQ["$row/$rep"]="$([[ -n "$pid" ]] && awk -v d=$((t1 - t0)) -v hz="$CLK_TCK" -v n="$requests" \
    'BEGIN{printf "%.2f", n ? 1e6*d/hz/n : 0}' || echo "")"
  # Connections the proxy opened to the backend per request (the one `accepted` itself
  # opens is taken off).
  M_CONNS["$row/$rep"]="$([[ -n "$a0" && "$row" != direct/* ]] && awk -v d=$((a1 - a0 - 1)) -v n="$requests" \
    'BEGIN{printf "%.4f", n ? d/n : 0}' || echo "")"
  M_REDISCPU["$row/$rep"]="$(awk -v d=$((r1 - r0)) -v hz="$CLK_TCK" -v n="$requests" 'BEGIN{printf "%.2f", n ? 1e6*d/hz/n : 0}')"
  log "rep $rep $row: $rps req/s, p99 ${p99_us}us, CPU ${M_CPUREQ[$row/$rep]:--}us/req, non-2xx $non2xx"
}

accepted() { # the connections our backend has accepted so far
  curl -s --max-time 2 "http://127.0.0.1:$BACKEND_PORT/__accepted"
}

median() { # the median of the numbers given ("" if none)
  printf '%s\n' "$@" | awk 'NF' | sort -g | awk '{v[NR]=$1} END{if (NR) printf "%g", NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a != "" && b != "" && b+0 > 0) printf "%.3f", a/b}'; }

onecore_main() {
  PIN=(taskset -c "$CPU")
  SG_WORKERS=1
  command -v taskset >/dev/null || die "taskset is needed (util-linux)"
  start_backend
  start_targets
  local rep row
  for rep in $(seq "$REPS"); do
    for row in "${ROWS[@]}"; do measure "$row" "$rep"; done
  done
  onecore_report
}

onecore_report() {
  local row c p rep rps=() vdir=() vng=() p99=() cpu=() cng=() non2xx
  echo
  echo "LAYOUT=onecore: wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency after a ${WARMUP} warm-up, $REPS repetitions"
  echo "interleaved; wrk, backend and proxy pinned to CPU $CPU (taskset), one worker each; medians."
  echo "$(nproc) CPUs, $(uname -r); $("$SG" --version 2>/dev/null || echo sluicegate);" \
    "$(nginx -v 2>&1 | sed 's/.*: //' || true) $(haproxy -v 2>/dev/null | awk 'NR==1{print "HAProxy " $3}' || true)"
  echo
  echo "| case | proxy | req/s | of direct | of nginx | p99 ms | CPU µs/req | CPU of nginx's | non-2xx | upstream conns/req |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  local conns=()
  for row in "${ROWS[@]}"; do
    c="${row%/*}" p="${row#*/}"
    rps=() vdir=() vng=() p99=() cpu=() cng=() conns=() non2xx=0
    for rep in $(seq "$REPS"); do
      conns+=("${M_CONNS[$row/$rep]:-}")
      rps+=("${M_RPS[$row/$rep]}")
      p99+=("${M_P99[$row/$rep]}")
      cpu+=("${M_CPUREQ[$row/$rep]}")
      non2xx=$((non2xx + ${M_NON2XX[$row/$rep]}))
      vdir+=("$(ratio "${M_RPS[$row/$rep]}" "${M_RPS[direct/backend/$rep]}")")
      vng+=("$(ratio "${M_RPS[$row/$rep]}" "${M_RPS[$c/nginx/$rep]:-}")")
      cng+=("$(ratio "${M_CPUREQ[$row/$rep]}" "${M_CPUREQ[$c/nginx/$rep]:-}")")
    done
    awk -v c="$c" -v p="$p" -v r="$(median "${rps[@]}")" -v d="$(median "${vdir[@]}")" \
      -v n="$(median "${vng[@]}")" -v q="$(median "${p99[@]}")" -v u="$(median "${cpu[@]}")" \
      -v un="$(median "${cng[@]}")" -v e="$non2xx" -v k="$(median "${conns[@]}")" \
      'function f(x, fmt) { return x == "" ? "–" : sprintf(fmt, x) }
      BEGIN{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", c, p, f(r, "%.0f"), f(d, "%.3f"),
        f(n, "%.2f×"), f(q/1000, "%.2f"), f(u, "%.1f"), f(un, "%.2f×"), e, f(k, "%.4f")}'
  done
  if [[ -n "${M_RPS[global/sluicegate/1]:-}" && -n "${M_RPS[forwarded/sluicegate/1]:-}" ]]; then
    local vfw=() rcpu=()
    for rep in $(seq "$REPS"); do
      vfw+=("$(ratio "${M_RPS[global/sluicegate/$rep]}" "${M_RPS[forwarded/sluicegate/$rep]}")")
      rcpu+=("${M_REDISCPU[global/sluicegate/$rep]}")
    done
    echo
    echo "global: $(median "${vfw[@]}")× forwarded's req/s (the same limit, local); Redis's CPU" \
      "$(median "${rcpu[@]}") µs/req beside the proxy's (medians)."
  fi
  echo
  echo "of direct / of nginx: req/s over the backend-direct run / nginx's run of the same case,"
  echo "each repetition on its own, then the median. CPU: the proxy's utime+stime per request."
  echo "non-2xx: summed over the repetitions (the rejected case answers 429 by design)."
  echo "upstream conns/req: connections the backend accepted per request during the measured run"
  echo "(sluicegate on its default pool; nginx with keepalive $NGX_KEEPALIVE, at least wrk's -c)."
}

# ---- LAYOUT=instructions ------------------------------------------------------------------------
declare -A IR # by "case/proxy"

callgrind_total() { # the instructions (Ir) of a callgrind dump file
  awk '/^(summary|totals):/ {print $2; exit}' "$1"
}

# Runs one proxy (already started under callgrind, pid $2, port $3) through the count.
count_instructions() { # $1 row, $2 pid, $3 port
  local row="$1" pid="$2" port="$3" before after
  "$CLIENT_BIN" "127.0.0.1:$port" $((REQUESTS / 10 + 1)) "$CONNECTIONS" >/dev/null || die "warm-up of $row failed"
  callgrind_control --zero "$pid" >/dev/null
  "$CLIENT_BIN" "127.0.0.1:$port" "$REQUESTS" "$CONNECTIONS" >"$TMP/client-${row//\//-}.txt" ||
    die "the count of $row failed"
  callgrind_control --dump="measured" "$pid" >/dev/null
  local dump
  dump="$(ls -t "$TMP"/cg-"${row//\//-}".out.* | head -1)"
  IR[$row]="$(awk -v t="$(callgrind_total "$dump")" -v n="$REQUESTS" 'BEGIN{printf "%.0f", t/n}')"
  log "$row: ${IR[$row]} instructions/request ($(tr '\n' ' ' <"$TMP/client-${row//\//-}.txt"))"
}

IR_ROWS=() # "case/proxy" in table order

# Runs a proxy under callgrind through the count, then stops it.
under_callgrind() { # $1 row, $2 port, $3 log file, the rest: the command
  local row="$1" port="$2" log="$3" pid
  shift 3
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg-${row//\//-}.out.%p" "$@" 2>>"$log" &
  pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "$pid"
  [[ "$row" != */sluicegate ]] || load_candidate "$CONFIG_OF_ROW"
  count_instructions "$row" "$pid" "$port"
  IR_ROWS+=("$row")
  stop_started "$pid"
}

instructions_main() {
  command -v valgrind >/dev/null || die "valgrind is needed (apt-get install valgrind)"
  [[ -x "$CLIENT_BIN" ]] || die "no $CLIENT_BIN (cargo build --release --example bench_client)"
  SG_WORKERS=1
  CONNECTIONS="${CONNECTIONS_IR:-8}"
  start_backend
  local c port dir
  for c in $CASES; do
    [[ "$c" != global ]] || start_redis
    port="$(free_port)"
    write_sg_conf "$TMP/sg-$c.yaml" "$port" "$(sg_limit "$c")" "$(sg_top "$c")"
    [[ "$c" != bearer && "$c" != jwt ]] || export BENCH_BEARER="$JWT_TOKEN"
    [[ "$c" != header_body && "$c" != json_body ]] || export BENCH_BODY=1024
    CONFIG_OF_ROW="$TMP/sg-$c.yaml"
    under_callgrind "$c/sluicegate" "$port" "$TMP/sg-$c.log" "$SG" -c "$TMP/sg-$c.yaml" --log-level warn
    unset BENCH_BEARER BENCH_BODY
    if [[ "$c" != global && "$c" != bearer && "$c" != jwt && "$c" != *_body ]] && has_peer nginx; then
      port="$(free_port)"
      dir="$TMP/nginx-$c"
      mkdir -p "$dir"
      write_nginx_conf "$dir" "$port" 1 "$(ng_http "$c")" "$(ng_location "$c")"
      # One process: the worker's loop runs in the process callgrind watches.
      sed -i 's/^daemon off;/daemon off;\nmaster_process off;/' "$dir/nginx.conf"
      under_callgrind "$c/nginx" "$port" "$dir/error.log" nginx -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf"
    fi
  done
  echo
  echo "LAYOUT=instructions: $REQUESTS requests over $CONNECTIONS connections (examples/bench_client),"
  echo "counted by valgrind --tool=callgrind after a warm-up; one worker each."
  echo
  echo "| case | proxy | instructions/request | of nginx's |"
  echo "|---|---|---|---|"
  local row r
  for row in "${IR_ROWS[@]}"; do
    c="${row%/*}"
    r="$(ratio "${IR[$row]}" "${IR[$c/nginx]:-}")"
    echo "| $c | ${row#*/} | ${IR[$row]} | ${r:+${r}×} |"
  done
}

# ---- LAYOUT=memory ------------------------------------------------------------------------------
rss_kb() { # VmRSS of a process and its direct children (nginx workers), kB
  local total=0 p kb
  for p in "$1" $(pgrep -P "$1" || true); do
    kb="$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)"
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}

declare -A MEM # by "mode/proxy": bytes per connection

# Holds HOLD connections in `mode` to the proxy (pid $2, port $3); records its cost.
hold_and_measure() { # $1 row, $2 pid, $3 port, $4 mode
  local row="$1" pid="$2" port="$3" mode="$4" before after fifo out i
  curl -s -o /dev/null "http://127.0.0.1:$port/" || true
  sleep 0.5
  before="$(rss_kb "$pid")"
  fifo="$TMP/hold-${row//\//-}"
  out="$TMP/hold-${row//\//-}.out"
  mkfifo "$fifo"
  "$HOLD_BIN" "127.0.0.1:$port" "$HOLD" "$mode" <"$fifo" >"$out" 2>&1 &
  local holder=$!
  exec 9>"$fifo"
  for i in $(seq 600); do
    grep -q ready "$out" 2>/dev/null && break
    kill -0 "$holder" 2>/dev/null || { cat "$out" >&2; die "hold_connections failed for $row"; }
    sleep 0.1
  done
  sleep 1
  after="$(rss_kb "$pid")"
  exec 9>&-
  wait "$holder" || true
  MEM[$row]=$(((after - before) * 1024 / HOLD))
  log "$row: $(((after - before) * 1024)) bytes over $HOLD connections: ${MEM[$row]} B each"
}

memory_main() {
  [[ -x "$HOLD_BIN" ]] || die "no $HOLD_BIN (cargo build --release --example hold_connections)"
  ulimit -n $((HOLD * 3 + 1000)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  SG_WORKERS=1
  SG_MAX_CONNECTIONS=$((HOLD * 2))
  NGX_CONNECTIONS=$((HOLD * 2 + 100))
  start_backend
  local mode port dir
  for mode in idle kept h2 busy; do
    port="$(free_port)"
    write_sg_conf "$TMP/sg-mem-$mode.yaml" "$port" ""
    start_sg "$TMP/sg-mem-$mode.yaml" "$port" "$TMP/sg-mem-$mode.log"
    hold_and_measure "$mode/sluicegate" "$START_PID" "$port" "$mode"
    stop_started "$START_PID"
    if [[ "$mode" != h2 ]] && has_peer nginx; then
      port="$(free_port)"
      dir="$TMP/nginx-mem-$mode"
      mkdir -p "$dir"
      write_nginx_conf "$dir" "$port" 1 "" ""
      start_nginx "$dir" "$port"
      hold_and_measure "$mode/nginx" "$START_PID" "$port" "$mode"
      stop_started "$START_PID"
    fi
  done
  echo
  echo "LAYOUT=memory: $HOLD connections held by examples/hold_connections, one worker each;"
  echo "the proxy's VmRSS with them open less before, per connection."
  echo
  echo "| connection | sluicegate | nginx |"
  echo "|---|---|---|"
  echo "| TCP connected, nothing sent yet | ${MEM[idle/sluicegate]} B | ${MEM[idle/nginx]:-–} B |"
  echo "| kept alive after one answered GET | ${MEM[kept/sluicegate]} B | ${MEM[kept/nginx]:-–} B |"
  echo "| HTTP/2 preface + SETTINGS, no stream | ${MEM[h2/sluicegate]} B | – |"
  echo "| a request in progress (GET, its upstream silent), with its upstream connection | ${MEM[busy/sluicegate]} B | ${MEM[busy/nginx]:-–} B |"
}

# ---- go ---------------------------------------------------------------------------------------
if [[ "$SKIP_BUILD" != 1 ]]; then
  log "cargo build --profile dist --no-default-features --bin sluicegate; cargo build --release --example …"
  (cd "$ROOT" && cargo build --profile dist --no-default-features --quiet --bin sluicegate &&
    cargo build --release --quiet --example bench_backend --example bench_client --example hold_connections)
fi
[[ -x "$SG" ]] || die "no $SG"

LIMIT_PASS="    key: ip
    rate: 100000000r/s
    burst: 1000
    nodelay: true"
LIMIT_REJECT="    key: ip
    rate: 10r/s
    status: 429"

# ---- LAYOUT=workers -----------------------------------------------------------------------------
workers_main() {
  local counts="${WORKERS:-1 2 4}" reps="${REPS:-3}" w r port dir
  BACKEND_PORT="$(free_port)"
  mkdir -p "$TMP/backend"
  write_backend_conf "$TMP/backend" "$BACKEND_PORT"
  start_nginx "$TMP/backend" "$BACKEND_PORT"
  log "backend nginx on 127.0.0.1:$BACKEND_PORT (worker_processes 1)"
  declare -A PORT PID
  for w in $counts; do
    port="$(free_port)"
    SG_WORKERS="$w" write_sg_conf "$TMP/sg-w$w.yaml" "$port" "$LIMIT_PASS"
    start_sg "$TMP/sg-w$w.yaml" "$port" "$TMP/sg-w$w.log"
    PORT[sluicegate/$w]="$port" PID[sluicegate/$w]="$START_PID"
    port="$(free_port)"
    dir="$TMP/nginx-w$w"
    mkdir -p "$dir"
    write_nginx_proxy_conf "$dir" "$port" "$w" 100000000r/s "burst=1000 nodelay"
    start_nginx "$dir" "$port"
    PORT[nginx/$w]="$port" PID[nginx/$w]="$START_PID"
  done
  for r in $(seq "$reps"); do
    for w in $counts; do
      for p in sluicegate nginx; do run_case "$p/$w/$r" "${PORT[$p/$w]}" "${PID[$p/$w]}"; done
    done
  done
  echo
  echo "LAYOUT=workers: wrk -t$THREADS -c$CONNECTIONS -d$DURATION after a ${WARMUP} warm-up, medians of $reps"
  echo "interleaved runs; $(nproc) cores shared by wrk, the backend (nginx, 1 worker) and the proxy."
  echo
  echo "| workers | proxy | req/s | CPU µs/request | CPU over nginx's | CPU over its own with one worker |"
  echo "|---|---|---|---|---|---|"
  declare -A MRPS MCPU
  for w in $counts; do
    for p in sluicegate nginx; do
      MRPS[$p/$w]="$(median $(for r in $(seq "$reps"); do echo "${RPS[$p/$w/$r]}"; done))"
      MCPU[$p/$w]="$(median $(for r in $(seq "$reps"); do echo "${CPUREQ[$p/$w/$r]}"; done))"
    done
  done
  local first="${counts%% *}"
  for w in $counts; do
    for p in sluicegate nginx; do
      echo "| $w | $p | $(printf '%.0f' "${MRPS[$p/$w]}") | ${MCPU[$p/$w]} | $(ratio "${MCPU[$p/$w]}" "${MCPU[nginx/$w]}")× | $(ratio "${MCPU[$p/$w]}" "${MCPU[$p/$first]}")× |"
    done
  done
}

case "$LAYOUT" in
  workers) workers_main; exit 0 ;;
  onecore) onecore_main; exit 0 ;;
  instructions) instructions_main; exit 0 ;;
  memory) memory_main; exit 0 ;;
esac

BACKEND_PORT="$(free_port)"
mkdir -p "$TMP/backend"
write_backend_conf "$TMP/backend" "$BACKEND_PORT"
start_nginx "$TMP/backend" "$BACKEND_PORT"
BACKEND_PID="$START_PID"
log "backend nginx on 127.0.0.1:$BACKEND_PORT (worker_processes 1)"

# a. backend direct
run_case "a backend direct" "$BACKEND_PORT" "$BACKEND_PID"

# b, c, e: sluicegate
sg_case() { # $1 label, $2 tag, $3 limit yaml, $4 more top-level yaml
  local port conf
  port="$(free_port)"
  conf="$TMP/sg-$2.yaml"
  write_sg_conf "$conf" "$port" "$3" "${4:-}"
  start_sg "$conf" "$port" "$TMP/sg-$2.log"
  local pid="$START_PID"
  run_case "$1" "$port" "$pid"
  stop_started "$pid"
}
ng_case() { # $1 label, $2 tag, $3 workers, $4 rate, $5 limit_req args
  local port dir
  port="$(free_port)"
  dir="$TMP/nginx-$2"
  mkdir -p "$dir"
  write_nginx_proxy_conf "$dir" "$port" "$3" "$4" "$5"
  start_nginx "$dir" "$port"
  local pid="$START_PID"
  run_case "$1" "$port" "$pid"
  stop_started "$pid"
}

sg_case "b sluicegate no limit" nolimit ""
sg_case "c sluicegate limit (pass)" pass "$LIMIT_PASS"
ng_case "d nginx limit_req (pass) w1" pass-w1 1 100000000r/s "burst=1000 nodelay"
ng_case "d nginx limit_req (pass) wauto" pass-wauto auto 100000000r/s "burst=1000 nodelay"
sg_case "e sluicegate limit (429)" reject "$LIMIT_REJECT"
ng_case "f nginx limit_req (429) w1" reject-w1 1 10r/s "nodelay"
ng_case "f nginx limit_req (429) wauto" reject-wauto auto 10r/s "nodelay"

# g, h: the same limits, global, against a local Redis (no persistence)
start_redis
sg_case "g sluicegate global (pass)" global-pass "$LIMIT_PASS
    scope: global" "$REDIS_YAML"
sg_case "h sluicegate global (429)" global-reject "$LIMIT_REJECT
    scope: global" "$REDIS_YAML"

# ---- report ---------------------------------------------------------------------------------------
REF_SG="${RPS[c sluicegate limit (pass)]}"
REF_NG="${RPS[d nginx limit_req (pass) w1]}"
echo
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --timeout $WRK_TIMEOUT --latency (after a ${WARMUP} warm-up); $(nproc) cores shared by wrk, backend and proxy"
echo "backend: nginx worker_processes 1, 'return 200 \"ok\\n\"'; wauto = worker_processes auto = $(nproc) workers"
echo
printf '%-32s %10s %9s %9s %9s %12s %6s %9s %8s %8s %9s\n' \
  case "req/s" "p50 ms" "p99 ms" non-2xx "sockerr" "CPU%" "CPUus/req" "/sg-lim" "/ng-lr1" "redis/req"
for c in "${LABELS[@]}"; do
  awk -v c="$c" -v r="${RPS[$c]}" -v p50="${P50[$c]}" -v p99="${P99[$c]}" -v n="${NON2XX[$c]}" \
    -v se="${SOCKERR[$c]}" -v cpu="${CPU[$c]}" -v cr="${CPUREQ[$c]}" -v rs="$REF_SG" -v rn="$REF_NG" \
    -v rc="${RCMD[$c]}" \
    'BEGIN{printf "%-32s %10.0f %9.3f %9.3f %9d %12s %6s %9s %8.2f %8.2f %9s\n",
      c, r, p50/1000, p99/1000, n, se, cpu, cr, r/rs, r/rn, rc}'
done
echo
echo "sockerr = wrk socket errors connect/read/write/timeout; CPU% = CPU of the process under test"
echo "(nginx: master+workers; 200% = both cores) over the measured run; /sg-lim and /ng-lr1 = req/s"
echo "relative to 'c sluicegate limit (pass)' and 'd nginx limit_req (pass) w1'; redis/req = Redis"
echo "script calls (EVALSHA) per request during the measured run (redis-server shares the cores)."

# Non-2xx where nothing should be rejected deserves a look (benches/wrk/status.lua shows which).
for c in "${LABELS[@]}"; do
  if [[ "$c" != *429* && "${NON2XX[$c]}" != 0 ]]; then
    echo
    echo "NOTE: '$c' had ${NON2XX[$c]} non-2xx responses although nothing should be rejected;"
    echo "      rerun it with 'wrk ... -s benches/wrk/status.lua' to see the status codes."
  fi
done

# Anything the proxies logged at warn or above during the runs.
shopt -s nullglob
for f in "$TMP"/sg-*.log "$TMP"/*/error.log; do
  if [[ -s "$f" ]]; then
    echo
    echo "log ${f#"$TMP"/} ($(wc -l <"$f") lines), last 5:"
    tail -n 5 "$f"
  fi
done
