-- Decides requests one after another, each against several global limits at once, all
-- or nothing: the requests of one call are those that were waiting for Redis together,
-- decided at one instant as if they had arrived in this order.
--
-- ARGV: now_s, now_us ('' and '': Redis TIME), request count, limit count, then per
-- limit (sent once, however many requests use it): dry_run (0/1), window count, ban ns
-- (0: none), ban_max ns, then per window: kind, p1, p2, p3. Then per request: cost,
-- group count, then per group: its limit (1-based, in the list above), then per window
-- the lease id ('' but for a concurrency window). KEYS: per request, per group, one per
-- window, then the ban's if any.
-- Reply: one string of little-endian 64-bit integers: now_s, now_us, then per request,
-- per window: admitted (0/1), wait or retry ns, remaining, reset ns, excess in
-- thousandths, banned (0/1). (A string, not an array of integers: the proxy reads it
-- with a few loads, where a RESP parser spends hundreds of instructions per integer.)
local algorithms = { lb = leaky_bucket, fw = fixed_window, sw = sliding_window, sl = sliding_log, cc = concurrency }

-- The limits, read once: { dry, ban_base, ban_max, windows = { { algorithm, p } } }.
local function limits(a)
  local list = {}
  for l = 1, tonumber(ARGV[4]) do
    local limit = { dry = ARGV[a] == '1', ban_base = tonumber(ARGV[a + 2]), ban_max = tonumber(ARGV[a + 3]),
                    windows = {} }
    local windows = tonumber(ARGV[a + 1])
    a = a + 4
    for w = 1, windows do
      limit.windows[w] = { algorithm = algorithms[ARGV[a]],
                           p = { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), '' } }
      a = a + 4
    end
    list[l] = limit
  end
  return list, a
end

-- One request at `now`: reads its arguments from ARGV[a] and KEYS[k] on, appends its
-- windows' fields to `reply` (n windows so far, packed); returns where the next request's
-- arguments and keys start and the new window count.
local function decide(now, list, a, k, reply, n)
  local cost = tonumber(ARGV[a])
  local groups = {}
  a = a + 2
  for g = 1, tonumber(ARGV[a - 1]) do
    local limit = list[tonumber(ARGV[a])]
    local group = { dry = limit.dry, windows = {} }
    a = a + 1
    for w, spec in ipairs(limit.windows) do
      local p = spec.p
      -- A concurrency window's lease is the request's own.
      if ARGV[a] ~= '' then p = { p[1], p[2], p[3], ARGV[a] } end
      group.windows[w] = { algorithm = spec.algorithm, key = KEYS[k], p = p }
      a, k = a + 1, k + 1
    end
    if limit.ban_base > 0 then
      group.ban = { key = KEYS[k], base = limit.ban_base, max = limit.ban_max }
      k = k + 1
    end
    groups[g] = group
  end
  -- Decide every window; a banned key is refused by its first window for the time left.
  local rejected = false
  for _, group in ipairs(groups) do
    local left = group.ban and ban.left(group.ban, now)
    for w, window in ipairs(group.windows) do
      if w == 1 and left then
        window.v = { admit = false, retry = left, reset = left, excess = 0 }
      else
        window.v = window.algorithm.decide(window.key, window.p, now, cost)
      end
      group.rejects = group.rejects or not window.v.admit
    end
    -- An enforced limit's rejection starts a ban unless one runs.
    if group.rejects and group.ban and not group.dry and not left then
      local first = group.windows[1].v
      first.admit, first.retry, first.banned = false, ban.impose(group.ban, now), true
    end
    rejected = rejected or (group.rejects and not group.dry)
  end

  -- Store only if every enforced limit admits; a dry-run limit that would reject stores
  -- nothing, as if enforced.
  if not rejected then
    for _, group in ipairs(groups) do
      if not group.rejects then
        for _, window in ipairs(group.windows) do
          window.algorithm.store(window.key, window.p, now, cost, window.v)
        end
      end
    end
  end

  for _, group in ipairs(groups) do
    for _, window in ipairs(group.windows) do
      local v = window.v
      n = n + 1
      reply[n] = struct.pack('<i8i8i8i8i8i8', v.admit and 1 or 0, v.admit and v.wait or v.retry, v.remaining or 0,
                             v.reset, math.floor(v.excess * 1000), v.banned and 1 or 0)
    end
  end
  return a, k, n
end

local now = clock(ARGV[1], ARGV[2])
local list, a = limits(5)
local reply, k, n = { struct.pack('<i8i8', now.s, now.us) }, 1, 1
for _ = 1, tonumber(ARGV[3]) do
  a, k, n = decide(now, list, a, k, reply, n)
end
return table.concat(reply)
