#!/usr/bin/env bash
# Routing at scale, one core, beside nginx: requests per second of a proxy answering by
# itself (sluicegate `respond`, nginx `return 200`), so that only finding the route
# differs between the cases.
#
#   benches/wrk/routes.sh          (from anywhere; needs cargo, wrk, python3, taskset;
#                                   nginx where installed)
#
# The proxy (one worker: `server.workers: 1`, nginx `worker_processes 1`) is pinned to
# CPU $CPU and wrk (-t1 -c16) to CPU $WRK_CPU. Cases, each for every size in SIZES
# [1 10000 100000] (nginx: those up to NGINX_MAX [10000]):
#   prefix     routes `path_prefix: /rN/` (nginx: `location /rN/`); the last one asked for
#   host       routes `host: hN.example.com` (nginx: one `server` per name); the last one
#   no_match   the prefix routes, and a path none of them matches (sluicegate answers 404;
#              nginx's catch-all `location /` answers 404)
#   regex      routes `path_regex: ^/sN/t/(?<tenant>[a-z0-9-]+)/` (nginx: `location ~`)
#              limited to REGEX_MAX [1000]; the last one
# Every server is started once; the measured runs are interleaved (repetition 1 of every
# case, then repetition 2, ...) and the table gives the median req/s over REPS [3], and
# over the same proxy's one-route run of the case.
#   DURATION [5s]  WARMUP [1s]  CPU [0]  WRK_CPU [1]  SG [target/dist/sluicegate]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIZES=${SIZES:-"1 10000 100000"}
NGINX_MAX=${NGINX_MAX:-10000}
REGEX_MAX=${REGEX_MAX:-1000}
REPS=${REPS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
CPU=${CPU:-0}
WRK_CPU=${WRK_CPU:-1}
SG=${SG:-$ROOT/target/dist/sluicegate}
[[ -n ${SKIP_BUILD:-} ]] || (cd "$ROOT" && cargo build --profile dist --no-default-features --quiet --bin sluicegate && cargo build --release --quiet)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# sluicegate_config CASE SIZE PORT > file
sluicegate_config() {
    python3 - "$@" <<'EOF'
import sys
case, n, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"listen: 127.0.0.1:{port}\nserver: {{ workers: 1 }}\nroutes:")
for i in range(n):
    if case == "host":
        print(f"  - {{ match: {{ host: h{i}.example.com }}, respond: {{ status: 200 }} }}")
    elif case == "regex":
        print(f"  - {{ match: {{ path_regex: '^/s{i}/t/(?<tenant>[a-z0-9-]+)/' }}, respond: {{ status: 200 }} }}")
    else:
        print(f"  - {{ match: {{ path_prefix: /r{i}/ }}, respond: {{ status: 200 }} }}")
EOF
}

nginx_config() {
    python3 - "$@" <<'EOF'
import sys
case, n, port, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"""worker_processes 1; daemon off; pid {tmp}/nginx-{case}-{n}.pid; error_log stderr warn;
events {{ worker_connections 4096; }}
http {{ access_log off; server_names_hash_max_size 262144; server_names_hash_bucket_size 128;""")
if case == "host":
    for i in range(n):
        print(f"  server {{ listen 127.0.0.1:{port}; server_name h{i}.example.com; location / {{ return 200; }} }}")
else:
    print(f"  server {{ listen 127.0.0.1:{port};")
    for i in range(n):
        if case == "regex":
            print(f"    location ~ ^/s{i}/t/(?<tenant>[a-z0-9-]+)/ {{ return 200; }}")
        else:
            print(f"    location /r{i}/ {{ return 200; }}")
    print("    location / { return 404; }\n  }")
print("}")
EOF
}

# The request of CASE at SIZE: path and Host.
target() {
    local last=$(($2 - 1))
    case $1 in
        prefix) echo "/r$last/items/7 example.com" ;;
        host) echo "/items/7 h$last.example.com" ;;
        no_match) echo "/nowhere/items/7 example.com" ;;
        regex) echo "/s$last/t/acme-corp/orders/12345 example.com" ;;
    esac
}

RUNS=()  # "proxy case size port"
start() { # proxy case size
    local proxy=$1 case=$2 n=$3 port
    port=$(free_port)
    local file=$TMP/$proxy-$case-$n
    if [[ $proxy == sluicegate ]]; then
        sluicegate_config "${case/no_match/prefix}" "$n" "$port" >"$file.yaml"
        taskset -c "$CPU" "$SG" run -c "$file.yaml" --log-level error 2>"$file.log" &
    else
        nginx_config "${case/no_match/prefix}" "$n" "$port" "$TMP" >"$file.conf"
        taskset -c "$CPU" nginx -c "$file.conf" -p "$TMP" 2>"$file.log" &
    fi
    PIDS+=($!)
    local read
    read=$(target "$case" "$n")
    for _ in $(seq 600); do
        curl -s -o /dev/null -H "Host: ${read#* }" "http://127.0.0.1:$port${read% *}" && break
        sleep 0.1
    done
    RUNS+=("$proxy $case $n $port")
}

PROXIES=sluicegate
command -v nginx >/dev/null && PROXIES="sluicegate nginx"
for proxy in $PROXIES; do
    for case in prefix host no_match regex; do
        for n in $SIZES; do
            [[ $proxy == nginx && $n -gt $NGINX_MAX ]] && continue
            [[ $case == regex && $n -gt $REGEX_MAX ]] && n=$REGEX_MAX
            [[ " ${RUNS[*]} " == *" $proxy $case $n "* ]] && continue
            start "$proxy" "$case" "$n"
        done
    done
done

declare -A RATES
for rep in $(seq "$REPS"); do
    for run in "${RUNS[@]}"; do
        read -r proxy case n port <<<"$run"
        read=$(target "$case" "$n")
        url="http://127.0.0.1:$port${read% *}"
        taskset -c "$WRK_CPU" wrk -t1 -c16 -d"$WARMUP" -H "Host: ${read#* }" "$url" >/dev/null
        rate=$(taskset -c "$WRK_CPU" wrk -t1 -c16 -d"$DURATION" -H "Host: ${read#* }" "$url" |
            awk '/Requests\/sec/ {print $2}')
        RATES[$proxy $case $n]+="$rate "
        echo "rep $rep: $proxy $case $n routes: $rate req/s" >&2
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| proxy | case | routes | req/s | over 1 route |"
echo "|---|---|---:|---:|---:|"
for run in "${RUNS[@]}"; do
    read -r proxy case n _ <<<"$run"
    rate=$(median <<<"${RATES[$proxy $case $n]}")
    one=$(median <<<"${RATES[$proxy $case 1]:-$rate}")
    awk -v p="$proxy" -v c="$case" -v n="$n" -v r="$rate" -v o="$one" \
        'BEGIN { printf "| %s | %s | %s | %.0f | %.2f |\n", p, c, n, r, r / o }'
done
