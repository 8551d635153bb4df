-- Sliding window counter, as `limit/sliding_window.rs`: prev · (1 − elapsed/window) + curr.
-- State: "index prev curr" (index of the window `curr` counts). p = {limit, window in ms}.
-- The weighting runs in count·µs where the local one runs in count·ns: Redis TIME has µs
-- resolution, so both are the same comparison scaled by 1000.
local sliding_window = {}

local function counts(key, w, now)
  local index = idiv(now.ms, w)
  local state = get(key)
  if state then
    local i, prev, curr = string.match(state, '^(%d+) (%d+) (%d+)$')
    i, prev, curr = tonumber(i), tonumber(prev), tonumber(curr)
    if i == index then return index, prev, curr, i end
    if i + 1 == index then return index, curr, 0, i end
    return index, 0, 0, i
  end
  return index, 0, 0, nil
end

-- ns until the estimate is back to zero.
local function reset(w, prev, curr, elapsed)
  if curr > 0 then return 2 * w - elapsed end
  if prev > 0 then return w - elapsed end
  return 0
end

-- ns until `estimate + cost <= limit` holds again (never early); w and elapsed in µs.
local function retry_after(limit, w, prev, curr, elapsed, cost)
  if curr + cost <= limit and prev > 0 then
    local at = w * 1000 - idiv_ns((limit - cost - curr) * w, prev)
    if at < w * 1000 then return math.max(1, at - elapsed * 1000) end
  end
  local at = 0
  if curr > 0 then at = w * 1000 - idiv_ns(math.max(0, limit - cost) * w, curr) end
  return (w - elapsed) * 1000 + at
end

-- Where the key stands, nothing taken: the units its estimate leaves room for, and until
-- the estimate is back to zero (ns).
function sliding_window.stands(key, p, now)
  local limit, w = p[1], p[2] * 1000
  local _, prev, curr = counts(key, p[2], now)
  local elapsed = (now.ms % p[2]) * 1000 + now.us % 1000
  local weighted = prev * (w - elapsed) + curr * w
  return idiv(math.max(0, limit * w - weighted), w), reset(w, prev, curr, elapsed) * 1000
end

function sliding_window.decide(key, p, now, cost)
  local limit, w = p[1], p[2] * 1000
  local index, prev, curr = counts(key, p[2], now)
  local elapsed = (now.ms % p[2]) * 1000 + now.us % 1000
  local weighted = prev * (w - elapsed) + curr * w
  if weighted + cost * w > limit * w then
    return { admit = false, retry = retry_after(limit, w, prev, curr, elapsed, cost),
             remaining = idiv(math.max(0, limit * w - weighted), w),
             reset = reset(w, prev, curr, elapsed) * 1000, excess = weighted / w }
  end
  return { admit = true, wait = 0, remaining = idiv(limit * w - weighted - cost * w, w),
           reset = reset(w, prev, curr + cost, elapsed) * 1000, excess = weighted / w + cost,
           state = string.format('%d %d %d', index, prev, curr + cost), ttl = 2 * w - elapsed }
end

function sliding_window.store(key, p, now, cost, v)
  put(key, v.state, ttl_ms(v.ttl * 1000))
end

function sliding_window.refund(key, p, at, cost)
  local state = redis.call('GET', key)
  if not state then return end
  local i, prev, curr = string.match(state, '^(%d+) (%d+) (%d+)$')
  i, prev, curr = tonumber(i), tonumber(prev), tonumber(curr)
  local age = i - idiv(at.ms, p[2])
  if age == 0 then curr = math.max(0, curr - cost) elseif age == 1 then prev = math.max(0, prev - cost) end
  redis.call('SET', key, string.format('%d %d %d', i, prev, curr), 'KEEPTTL')
end
