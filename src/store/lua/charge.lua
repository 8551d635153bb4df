-- Debits what responses reported they cost (`charge:`), after their admissions, past
-- the quota if need be.
-- ARGV: now_s, now_us ('' and '': Redis TIME), then per key: units, kind, p1, p2, p3, p4.
-- KEYS: one per window.
local algorithms = { lb = leaky_bucket, fw = fixed_window, cw = calendar_window }

local now = clock(ARGV[1], ARGV[2])
for k, key in ipairs(KEYS) do
  local a = 3 + (k - 1) * 6
  local algorithm = algorithms[ARGV[a + 1]]
  if algorithm then
    algorithm.charge(key, { tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]) },
                     now, tonumber(ARGV[a]))
  end
end
return #KEYS
