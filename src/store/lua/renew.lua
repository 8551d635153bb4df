-- Extends live concurrency leases: KEYS are lease sets, ARGV[1] the lease ttl in ms,
-- ARGV[2..] the lease ids, one per key. A lease already gone (expired, or its set
-- flushed) is not brought back. Returns how many were renewed.
local now = clock('', '')
local ttl = tonumber(ARGV[1])
local renewed = 0
for k, key in ipairs(KEYS) do
  if redis.call('ZSCORE', key, ARGV[k + 1]) then
    redis.call('ZADD', key, 'XX', now.ms + ttl, ARGV[k + 1])
    redis.call('PEXPIRE', key, ttl)
    renewed = renewed + 1
  end
end
return renewed
