-- Instants and spans, exact in Lua numbers (doubles: integers up to 2^53).
--
-- An instant is ns since the Unix epoch as {s = seconds, n = ns within the second},
-- with `ms` (ms since the epoch) and `us` (µs within the second) for the windows. Its
-- ns value, about 2^61, does not fit a double; a difference of two instants does as
-- long as it is under 2^53 ns (104 days), which the config guarantees for every span
-- a script computes. State is stored as decimal ns strings, the u64 the local
-- limiters keep.

local E9 = 1000000000

local function instant(s, n)
  local carry = math.floor(n / E9)
  s, n = s + carry, n - carry * E9
  return { s = s, n = n, ms = s * 1000 + math.floor(n / 1000000), us = math.floor(n / 1000) }
end

-- The current instant: the caller's (tests replay schedules) or Redis TIME, the one
-- clock of every instance.
local function clock(s, us)
  if s == '' then
    local t = redis.call('TIME')
    s, us = t[1], t[2]
  end
  return instant(tonumber(s), tonumber(us) * 1000)
end

local function parse(text)
  if not text then return nil end
  local len = string.len(text)
  if len <= 9 then return instant(0, tonumber(text)) end
  return instant(tonumber(string.sub(text, 1, len - 9)), tonumber(string.sub(text, len - 8)))
end

local function format(t)
  if t.s == 0 then return string.format('%d', t.n) end
  return string.format('%d%09d', t.s, t.n)
end

-- a - b, in ns.
local function since(a, b)
  return (a.s - b.s) * E9 + (a.n - b.n)
end

-- t + d ns.
local function plus(t, d)
  return instant(t.s, t.n + d)
end

-- floor(a / b) for integers, exact where a / b rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- floor(1000 · a / b) without forming 1000 · a: µs quantities to ns.
local function idiv_ns(a, b)
  local q = idiv(a, b)
  return q * 1000 + idiv((a - q * b) * 1000, b)
end

-- String state as a DECIDE call reads and writes it: a key that several requests of the
-- call use is read from Redis once and written once, at the end (`flush`), as the
-- writes in order would leave it (a script runs alone, at one instant). A flood from
-- one client puts many of its requests in one call.
local strings, written = {}, {}

local function get(key)
  local value = strings[key]
  if value == nil then
    value = redis.call('GET', key)
    strings[key] = value
  end
  return value
end

-- Sets `key` to `value`, to expire in `ttl` ms.
local function put(key, value, ttl)
  strings[key], written[key] = value, ttl
end

local function flush()
  for key, ttl in pairs(written) do
    redis.call('SET', key, strings[key], 'PX', ttl)
  end
end

-- Milliseconds for PEXPIRE, never early.
local function ttl_ms(ns)
  return math.floor(ns / 1000000) + 1
end
