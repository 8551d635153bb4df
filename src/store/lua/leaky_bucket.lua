-- nginx limit_req's leaky bucket, as `limit/leaky_bucket.rs` keeps it: the instant `tat`
-- at which the bucket drains empty. p = {period, burst · period, delay · period} in ns.
local leaky_bucket = {}

function leaky_bucket.decide(key, p, now, cost)
  local period, burst, delay = p[1], p[2], p[3]
  local tat = parse(get(key))
  local first = 0
  if tat then first = math.max(0, since(tat, now) + period) end
  local excess = first + (cost - 1) * period
  if excess > burst then
    -- reset: until the full burst is back, one period after the bucket drains.
    local reset = 0
    if tat then reset = first end
    -- Units that still fit now: those whose single-unit excess stays within burst.
    local remaining = 0
    if first <= burst then remaining = idiv(burst - first, period) + 1 end
    return { admit = false, retry = excess - burst, remaining = remaining, reset = reset, excess = excess / period }
  end
  return { admit = true, wait = math.max(0, excess - delay), remaining = idiv(burst - excess, period),
           reset = excess + period, excess = excess / period }
end

-- The key is a fresh one's equal once `tat + period` (now + reset) has passed: it
-- expires then.
function leaky_bucket.store(key, p, now, cost, v)
  put(key, format(plus(now, v.reset - p[1])), ttl_ms(v.reset))
end

function leaky_bucket.refund(key, p, at, cost)
  local tat = parse(redis.call('GET', key))
  if tat then redis.call('SET', key, format(plus(tat, -cost * p[1])), 'KEEPTTL') end
end
