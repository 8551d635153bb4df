-- Sliding window log, exact, as `limit/sliding_log.rs`: a list of the instants (ns
-- strings, oldest first) of the admissions within the last window. p = {limit, window ns}.
local sliding_log = {}

function sliding_log.decide(key, p, now, cost)
  local limit, window = p[1], p[2]
  -- Expired entries go first: the same decisions follow with or without them.
  while true do
    local oldest = redis.call('LINDEX', key, 0)
    if not oldest or since(now, parse(oldest)) < window then break end
    redis.call('LPOP', key)
  end
  local live = redis.call('LLEN', key)
  local reset = 0
  local newest = redis.call('LINDEX', key, -1)
  if newest then reset = math.max(0, window - since(now, parse(newest))) end
  if live + cost > limit then
    -- Enough of the oldest must expire to make room for `cost`.
    local t = redis.call('LINDEX', key, live + cost - limit - 1)
    local retry = window
    if t then retry = window - since(now, parse(t)) end
    return { admit = false, retry = retry, remaining = math.max(0, limit - live), reset = reset, excess = live }
  end
  return { admit = true, wait = 0, remaining = limit - live - cost, reset = window, excess = live + cost }
end

-- Where the key stands, nothing taken (after `decide`, which dropped what expired): the
-- units left in the window, and until its newest entry expires (ns).
function sliding_log.stands(key, p, now)
  local reset = 0
  local newest = redis.call('LINDEX', key, -1)
  if newest then reset = math.max(0, p[2] - since(now, parse(newest))) end
  return math.max(0, p[1] - redis.call('LLEN', key)), reset
end

function sliding_log.store(key, p, now, cost, v)
  local t = format(now)
  for _ = 1, cost do redis.call('RPUSH', key, t) end
  redis.call('PEXPIRE', key, ttl_ms(p[2]))
end

function sliding_log.refund(key, p, at, cost)
  redis.call('LREM', key, -cost, format(at))
end
