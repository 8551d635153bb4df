-- Fixed window, windows aligned to the Unix epoch, as `limit/fixed_window.rs`.
-- State: "index count". p = {limit, window in ms}.
local fixed_window = {}

local function window_count(key, w, now)
  local state = get(key)
  local index = idiv(now.ms, w)
  if state then
    local i, c = string.match(state, '^(%d+) (%d+)$')
    if tonumber(i) == index then return index, tonumber(c) end
  end
  return index, 0
end

-- Where the key stands, nothing taken: the units left in the window, and its end (ns).
function fixed_window.stands(key, p, now)
  local index, count = window_count(key, p[2], now)
  return math.max(0, p[1] - count), ((index + 1) * p[2] - now.ms) * 1000000 - (now.n % 1000000)
end

function fixed_window.decide(key, p, now, cost)
  local limit, w = p[1], p[2]
  local index, count = window_count(key, w, now)
  local reset = ((index + 1) * w - now.ms) * 1000000 - (now.n % 1000000)
  if count + cost > limit then
    return { admit = false, retry = reset, remaining = math.max(0, limit - count), reset = reset, excess = count }
  end
  count = count + cost
  return { admit = true, wait = 0, remaining = limit - count, reset = reset, excess = count, index = index }
end

function fixed_window.store(key, p, now, cost, v)
  put(key, string.format('%d %d', v.index, v.excess), ttl_ms(v.reset))
end

function fixed_window.refund(key, p, at, cost)
  local index, count = window_count(key, p[2], at)
  if count > 0 then
    redis.call('SET', key, string.format('%d %d', index, math.max(0, count - cost)), 'KEEPTTL')
  end
end
