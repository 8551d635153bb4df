-- Fixed window, as `limit/fixed_window.rs`. State: "index count".
-- `fixed_window` (fw): windows of a length aligned to the Unix epoch, indexed by their
-- number; p = {limit, window in ms}.
-- `calendar_window` (cw): days, weeks or months of a time zone, which only the caller can
-- compute (Redis has no time zone rules): p = {limit, start, end, next end} in ms, the
-- window of the caller's clock and the next one's end. Redis's clock says in which of the
-- three windows around a request falls (the one before ends at `start`), so instances
-- whose clocks differ a little still count each request in the window Redis is in. A
-- calendar window is indexed by its end.

local function window_count(key, index)
  local state = get(key)
  if state then
    local i, c = string.match(state, '^(%d+) (%d+)$')
    if tonumber(i) == index then return tonumber(c) end
  end
  return 0
end

-- The algorithm over windows that `span(p, now)` gives as their index and end (ms).
local function windowed(m, span)
  -- Where the key stands, nothing taken: the units left in the window, and its end (ns).
  function m.stands(key, p, now)
    local index, ends = span(p, now)
    return math.max(0, p[1] - window_count(key, index)), (ends - now.ms) * 1000000 - (now.n % 1000000)
  end

  function m.decide(key, p, now, cost)
    local limit = p[1]
    local index, ends = span(p, now)
    local count = window_count(key, index)
    local reset = (ends - now.ms) * 1000000 - (now.n % 1000000)
    if count + cost > limit then
      return { admit = false, retry = reset, remaining = math.max(0, limit - count), reset = reset, excess = count }
    end
    count = count + cost
    return { admit = true, wait = 0, remaining = limit - count, reset = reset, excess = count, index = index }
  end

  function m.store(key, p, now, cost, v)
    put(key, string.format('%d %d', v.index, v.excess), ttl_ms(v.reset))
  end

  function m.refund(key, p, at, cost)
    local index = span(p, at)
    local count = window_count(key, index)
    if count > 0 then
      redis.call('SET', key, string.format('%d %d', index, math.max(0, count - cost)), 'KEEPTTL')
    end
  end
end

windowed(fixed_window, function(p, now)
  local index = idiv(now.ms, p[2])
  return index, (index + 1) * p[2]
end)

windowed(calendar_window, function(p, now)
  local ends = p[4]
  if now.ms < p[2] then ends = p[2] elseif now.ms < p[3] then ends = p[3] end
  -- Redis more than a window ahead of the caller: the request waits for the caller's
  -- clock to catch up (1 ms at a time), never counted in a window not given.
  ends = math.max(ends, now.ms + 1)
  return ends, ends
end)
