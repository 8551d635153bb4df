-- nginx limit_req's leaky bucket, as `limit/leaky_bucket.rs` keeps it: the instant `tat`
-- at which the bucket drains empty. p = {period, burst · period, delay · period} in ns.
local leaky_bucket = {}

-- A one-unit request's excess (ns) at `now` with the bucket at `tat` (nil: fresh).
local function first_excess(tat, period, now)
  if tat then return math.max(0, since(tat, now) + period) end
  return 0
end

-- Where the key stands, nothing taken: the units that fit now (those whose single-unit
-- excess stays within burst), and until the full burst is back (one period after the
-- bucket drains; 0 for a fresh key).
local function standing(first, period, burst)
  local remaining = 0
  if first <= burst then remaining = idiv(burst - first, period) + 1 end
  return remaining, first
end

function leaky_bucket.stands(key, p, now)
  return standing(first_excess(parse(get(key)), p[1], now), p[1], p[2])
end

function leaky_bucket.decide(key, p, now, cost)
  local period, burst, delay = p[1], p[2], p[3]
  local first = first_excess(parse(get(key)), period, now)
  local excess = first + (cost - 1) * period
  if excess > burst then
    local remaining, reset = standing(first, period, burst)
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

-- Debits `units` more after an admission (what its response reported it cost): the
-- bucket drains that much later, past its burst if need be, a debt the next requests
-- pay by being refused. A key idle since starts from a fresh key's state.
function leaky_bucket.charge(key, p, now, units)
  local period = p[1]
  local from = plus(now, -period)
  local tat = parse(redis.call('GET', key))
  if tat and since(tat, from) > 0 then from = tat end
  local drained = plus(from, units * period)
  redis.call('SET', key, format(drained), 'PX', ttl_ms(since(drained, now) + period))
end
