-- Temporary bans, as `limit/ban.rs`. State: "until_ms strikes". b = {key, base ns, max ns}.
local ban = {}

local function read(key)
  local state = get(key)
  if not state then return nil end
  local until_ms, strikes = string.match(state, '^(%d+) (%d+)$')
  return tonumber(until_ms), tonumber(strikes)
end

-- ns the key stays banned from `now`, or nil.
function ban.left(b, now)
  local until_ms = read(b.key)
  if not until_ms then return nil end
  local left = (until_ms - now.ms) * 1000000 - (now.n % 1000000)
  if left > 0 then return left end
  return nil
end

-- Bans the key from `now`; returns the ban's length in ns.
function ban.impose(b, now)
  local until_ms, strikes = read(b.key)
  if until_ms and (until_ms - now.ms) * 1000000 - (now.n % 1000000) + b.max > 0 then
    strikes = strikes + 1
  else
    strikes = 1
  end
  local length = math.min(b.base * 2 ^ math.min(strikes - 1, 62), b.max)
  local until_new = now.ms + idiv(now.n % 1000000 + length, 1000000)
  put(b.key, string.format('%d %d', until_new, math.min(strikes, 65535)), until_new - now.ms + ttl_ms(b.max))
  return length
end
