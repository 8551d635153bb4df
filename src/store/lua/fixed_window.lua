-- Fixed window, as `limit/fixed_window.rs`. State: "index count".
-- `fixed_window` (fw): windows of a length aligned to the Unix epoch, indexed by their
-- number; p = {limit, window in ms}.
-- `calendar_window` (cw): days, weeks or months of a time zone, which only the caller can
-- compute (Redis has no time zone rules): p = {limit, start, end, next end} in ms, the
-- window of the caller's clock and the next one's end. Redis's clock says in which of the
-- three windows around a request falls (the one before ends at `start`), so instances
-- whose clocks differ a little still count each request in the window Redis is in. A
-- calendar window is indexed by its end.

-- The count in window `index` for the key's state: its own, or what the window just
-- before it (`previous`) counted past `limit` (a charge's debt), at most a whole window's.
local function window_count(key, limit, index, previous)
  local state = get(key)
  if state then
    local i, c = string.match(state, '^(%d+) (%d+)$')
    i, c = tonumber(i), tonumber(c)
    if i == index then return c end
    if i == previous and c > limit then return math.min(c - limit, limit) end
  end
  return 0
end

-- The algorithm over windows that `span(p, now)` gives as their index, end (ms), the
-- index of the window before and the next window's length (ms).
local function windowed(m, span)
  -- Where the key stands, nothing taken: the units left in the window, and its end (ns).
  function m.stands(key, p, now)
    local index, ends, previous = span(p, now)
    return math.max(0, p[1] - window_count(key, p[1], index, previous)),
           (ends - now.ms) * 1000000 - (now.n % 1000000)
  end

  function m.decide(key, p, now, cost)
    local limit = p[1]
    local index, ends, previous, next_length = span(p, now)
    local count = window_count(key, limit, index, previous)
    local reset = (ends - now.ms) * 1000000 - (now.n % 1000000)
    if count + cost > limit then
      -- A debt past this window's limit fills the next one too.
      local retry = reset
      if math.min(math.max(count - limit, 0), limit) + cost > limit then retry = reset + next_length * 1000000 end
      return { admit = false, retry = retry, remaining = math.max(0, limit - count), reset = reset, excess = count }
    end
    count = count + cost
    return { admit = true, wait = 0, remaining = limit - count, reset = reset, excess = count, index = index }
  end

  function m.store(key, p, now, cost, v)
    put(key, string.format('%d %d', v.index, v.excess), ttl_ms(v.reset))
  end

  function m.refund(key, p, at, cost)
    local index, _, previous = span(p, at)
    local count = window_count(key, p[1], index, previous)
    if count > 0 then
      redis.call('SET', key, string.format('%d %d', index, math.max(0, count - cost)), 'KEEPTTL')
    end
  end

  -- Debits `units` more after an admission, past the limit if need be: what is past it
  -- is carried into the next window, whose end the key then lives to.
  function m.charge(key, p, now, units)
    local limit = p[1]
    local index, ends, previous, next_length = span(p, now)
    local count = math.min(window_count(key, limit, index, previous) + units, 16777215)
    local ttl = ends - now.ms
    if count > limit then ttl = ttl + next_length end
    redis.call('SET', key, string.format('%d %d', index, count), 'PX', math.max(ttl, 0) + 1)
  end
end

windowed(fixed_window, function(p, now)
  local index = idiv(now.ms, p[2])
  return index, (index + 1) * p[2], index - 1, p[2]
end)

windowed(calendar_window, function(p, now)
  local ends = p[4]
  if now.ms < p[2] then ends = p[2] elseif now.ms < p[3] then ends = p[3] end
  -- Redis more than a window ahead of the caller: the request waits for the caller's
  -- clock to catch up (1 ms at a time), never counted in a window not given.
  ends = math.max(ends, now.ms + 1)
  local previous, next_length = nil, p[4] - p[3]
  if ends == p[2] then next_length = p[3] - p[2] elseif ends == p[3] then previous = p[2] elseif ends == p[4] then
    previous = p[3]
  end
  return ends, ends, previous, next_length
end)
