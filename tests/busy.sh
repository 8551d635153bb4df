#!/usr/bin/env bash
# Runs the whole test suite RUNS times (default 5) with both cores kept busy by two
# `yes > /dev/null` processes, as a shared CI machine may be, and reports the failures
# of each test. Exits non-zero if any run failed.
#
#   bash tests/busy.sh [RUNS] [-- extra cargo test arguments]
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
shift $(( $# > 0 ? 1 : 0 ))
[[ ${1:-} == -- ]] && shift

cargo test --release --no-run -q 2>&1 | grep -v '^$' || true

logs=$(mktemp -d)
busy=()
stop_load() {
    (( ${#busy[@]} )) && kill "${busy[@]}" 2>/dev/null
    busy=()
}
trap 'stop_load; rm -rf "$logs"' EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
    yes > /dev/null &
    busy+=($!)
done

failed_runs=0
for run in $(seq 1 "$runs"); do
    started=$SECONDS
    cargo test --release "$@" > "$logs/$run.log" 2>&1
    status=$?
    # libtest prints each failing test as "    name" under "failures:" and, before,
    # "test name ... FAILED".
    grep -oE '^test [^ ]+ \.\.\. FAILED' "$logs/$run.log" | awk '{print $2}' > "$logs/$run.failed"
    count=$(wc -l < "$logs/$run.failed")
    if (( status != 0 )); then
        failed_runs=$((failed_runs + 1))
        (( count == 0 )) && echo "?? (cargo test exited $status without a failing test: see below)" > "$logs/$run.failed"
    fi
    printf 'run %d: %3d s, exit %d, %d failed\n' "$run" $((SECONDS - started)) "$status" "$count"
    if (( status != 0 )); then
        sed 's/^/    /' "$logs/$run.failed"
        grep -E "panicked at|^error" "$logs/$run.log" | head -20 | sed 's/^/      /'
    fi
done
stop_load

echo
if (( failed_runs == 0 )); then
    echo "$runs runs, no failure"
    exit 0
fi
echo "failures per test over $runs runs:"
cat "$logs"/*.failed | sort | uniq -c | sort -rn
exit 1
