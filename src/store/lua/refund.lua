-- Takes back admissions made at one instant: of limits that count only some statuses,
-- or of a request another Redis Cluster slot refused.
-- ARGV: at_s, at_us, cost, then per key: kind, p1, p2, p3, p4. KEYS: one per window.
local algorithms = { lb = leaky_bucket, fw = fixed_window, cw = calendar_window, sw = sliding_window,
                     sl = sliding_log }

local at = clock(ARGV[1], ARGV[2])
local cost = tonumber(ARGV[3])
for k, key in ipairs(KEYS) do
  local a = 4 + (k - 1) * 5
  local algorithm = algorithms[ARGV[a]]
  if algorithm then
    algorithm.refund(key, { tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]) },
                     at, cost)
  end
end
return #KEYS
