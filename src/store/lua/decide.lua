-- Decides requests one after another, each against several global limits at once, all
-- or nothing: the requests of one call are those that were waiting for Redis together,
-- decided at one instant as if they had arrived in this order.
--
-- ARGV: now_s, now_us ('' and '': Redis TIME), request count, limit count, then per
-- limit (sent once, however many requests use it): dry (0/1: it refuses nothing, in dry run
-- or annotating), window count, ban ns
-- (0: none), ban_max ns, then per window: kind, p1, p2, p3 (and p4 for a calendar window,
-- `cw`). Then per request: cost,
-- group count, then per group: its limit (1-based, in the list above), then per window
-- the lease id ('' but for a concurrency window). KEYS: per request, per group, one per
-- window, then the ban's if any.
-- Reply: one string of little-endian 64-bit integers: now_s, now_us, then per request,
-- per window: admitted (0/1), wait or retry ns, remaining, reset ns, excess in
-- thousandths, banned (0/1). (A string, not an array of integers: the proxy reads it
-- with a few loads, where a RESP parser spends hundreds of instructions per integer.)
local algorithms = { lb = leaky_bucket, fw = fixed_window, cw = calendar_window, sw = sliding_window, sl = sliding_log,
                     cc = concurrency }

-- The limits, read once: { dry, ban_base, ban_max, windows = { { algorithm, p } } }.
local function limits(a)
  local list = {}
  for l = 1, tonumber(ARGV[4]) do
    local limit = { dry = ARGV[a] == '1', ban_base = tonumber(ARGV[a + 2]), ban_max = tonumber(ARGV[a + 3]),
                    windows = {} }
    local windows = tonumber(ARGV[a + 1])
    a = a + 4
    for w = 1, windows do
      local kind, p = ARGV[a], { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), '' }
      a = a + 4
      -- A calendar window has one more: the next window's end.
      if kind == 'cw' then
        p[4] = tonumber(ARGV[a])
        a = a + 1
      end
      limit.windows[w] = { algorithm = algorithms[kind], p = p }
    end
    list[l] = limit
  end
  return list, a
end

-- Scratch arrays that every request of the call fills again, per group (a limit the
-- request uses) and per window (all its groups' windows in turn): a table per group and
-- per window of each request was a fifth of Redis's time per request.
local group_limit, group_ban, group_rejects = {}, {}, {}
local window_key, window_p, window_v = {}, {}, {}

-- One request at `now`: reads its arguments from ARGV[a] and KEYS[k] on, appends its
-- windows' fields to `reply` (n windows so far, packed); returns where the next request's
-- arguments and keys start and the new window count.
local function decide(now, list, a, k, reply, n)
  local cost, groups = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local w = 0
  for g = 1, groups do
    local limit = list[tonumber(ARGV[a])]
    group_limit[g] = limit
    a = a + 1
    for _, spec in ipairs(limit.windows) do
      w = w + 1
      local p = spec.p
      -- A concurrency window's lease is the request's own.
      if ARGV[a] ~= '' then p = { p[1], p[2], p[3], ARGV[a] } end
      window_key[w], window_p[w] = KEYS[k], p
      a, k = a + 1, k + 1
    end
    group_ban[g] = false
    if limit.ban_base > 0 then
      group_ban[g] = { key = KEYS[k], base = limit.ban_base, max = limit.ban_max }
      k = k + 1
    end
  end
  local windows = w

  -- Decide every window; a banned key is refused by its first window for the time left.
  local rejected = false
  w = 0
  for g = 1, groups do
    local limit, ban_state = group_limit[g], group_ban[g]
    local left = ban_state and ban.left(ban_state, now)
    local first, rejects = w + 1, false
    for i, spec in ipairs(limit.windows) do
      w = w + 1
      local v
      if i == 1 and left then
        v = { admit = false, retry = left, reset = left, excess = 0 }
      else
        v = spec.algorithm.decide(window_key[w], window_p[w], now, cost)
      end
      window_v[w] = v
      rejects = rejects or not v.admit
    end
    -- An enforced limit's rejection starts a ban unless one runs.
    if rejects and ban_state and not limit.dry and not left then
      local v = window_v[first]
      v.admit, v.retry, v.banned = false, ban.impose(ban_state, now), true
    end
    group_rejects[g] = rejects
    rejected = rejected or (rejects and not limit.dry)
  end

  -- Store only if every enforced limit admits; a dry-run limit that would reject stores
  -- nothing, as if enforced. A refused request did not count: the windows that would have
  -- admitted it say where the key stands.
  if rejected then
    w = 0
    for g = 1, groups do
      for _, spec in ipairs(group_limit[g].windows) do
        w = w + 1
        local v = window_v[w]
        if v.admit then v.remaining, v.reset = spec.algorithm.stands(window_key[w], window_p[w], now) end
      end
    end
  else
    w = 0
    for g = 1, groups do
      for _, spec in ipairs(group_limit[g].windows) do
        w = w + 1
        if not group_rejects[g] then
          spec.algorithm.store(window_key[w], window_p[w], now, cost, window_v[w])
        end
      end
    end
  end

  for w = 1, windows do
    local v = window_v[w]
    n = n + 1
    reply[n] = struct.pack('<i8i8i8i8i8i8', v.admit and 1 or 0, v.admit and v.wait or v.retry, v.remaining or 0,
                           v.reset, math.floor(v.excess * 1000), v.banned and 1 or 0)
  end
  return a, k, n
end

local now = clock(ARGV[1], ARGV[2])
local list, a = limits(5)
local reply, k, n = { struct.pack('<i8i8', now.s, now.us) }, 1, 1
for _ = 1, tonumber(ARGV[3]) do
  a, k, n = decide(now, list, a, k, reply, n)
end
flush()
return table.concat(reply)
