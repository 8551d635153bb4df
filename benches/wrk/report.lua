-- wrk script: after the run, print one machine-readable line for run.sh to parse.
-- Latency percentiles are in microseconds; "non2xx" is wrk's errors.status (status > 399).
done = function(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "WRKRESULT rps=%.1f requests=%d p50_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d secs=%.2f\n",
    summary.requests / secs, summary.requests,
    latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout, secs))
end
