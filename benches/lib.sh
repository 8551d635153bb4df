# What the benchmark scripts share (sourced; the caller defines `die` and NEXT_PORT).

free_port() { # first port >= NEXT_PORT on 127.0.0.1 that nothing answers on
  # Called as "$(free_port)", it runs in a subshell: the caller moves NEXT_PORT past what
  # it took.
  local p="$NEXT_PORT"
  while timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null; do p=$((p + 1)); done
  NEXT_PORT=$((p + 1))
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
