-- Decides requests one after another, each against several global limits at once, all
-- or nothing: the requests of one call are those that were waiting for Redis together,
-- decided at one instant as if they had arrived in this order.
--
-- ARGV: now_s, now_us ('' and '': Redis TIME), request count, then per request: cost,
-- group count, then per limit (a group): dry_run (0/1), window count, ban ns (0: none),
-- ban_max ns, then per window: kind, p1, p2, p3, p4. KEYS: per request, per group, one
-- per window, then the ban's if any.
-- Reply: now_s, now_us, then per request, per window: admitted (0/1), wait or retry ns,
-- remaining, reset ns, excess in thousandths, banned (0/1).
local algorithms = { lb = leaky_bucket, fw = fixed_window, sw = sliding_window, sl = sliding_log, cc = concurrency }

-- One request at `now`: reads its arguments from ARGV[a] and KEYS[k] on, appends its
-- windows' fields to `reply` (n fields so far); returns where the next request's
-- arguments and keys start and the new field count.
local function decide(now, a, k, reply, n)
  local cost = tonumber(ARGV[a])
  local groups = {}
  a = a + 2
  for g = 1, tonumber(ARGV[a - 1]) do
    local group = { dry = ARGV[a] == '1', windows = {} }
    local windows, ban_base, ban_max = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    a = a + 4
    for w = 1, windows do
      group.windows[w] = { algorithm = algorithms[ARGV[a]], key = KEYS[k],
                           p = { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4] } }
      a, k = a + 5, k + 1
    end
    if ban_base > 0 then
      group.ban = { key = KEYS[k], base = ban_base, max = ban_max }
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
      if v.admit then
        reply[n + 1], reply[n + 2] = 1, v.wait
      else
        reply[n + 1], reply[n + 2] = 0, v.retry
      end
      reply[n + 3], reply[n + 4], reply[n + 5] = v.remaining or 0, v.reset, math.floor(v.excess * 1000)
      reply[n + 6] = v.banned and 1 or 0
      n = n + 6
    end
  end
  return a, k, n
end

local now = clock(ARGV[1], ARGV[2])
local reply, a, k, n = { now.s, now.us }, 4, 1, 2
for _ = 1, tonumber(ARGV[3]) do
  a, k, n = decide(now, a, k, reply, n)
end
return reply
