-- Requests in flight across instances: a sorted set of leases, each scored with the
-- instant (ms) it lapses unless its holder renews it. p = {max, retry_after ns, lease
-- ttl ms, lease id}.
local concurrency = {}

function concurrency.decide(key, p, now, cost)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now.ms)
  local count = redis.call('ZCARD', key)
  if count >= p[1] then
    return { admit = false, retry = p[2], reset = p[2], excess = count }
  end
  return { admit = true, wait = 0, remaining = p[1] - count - 1, reset = 0, excess = count }
end

-- Where the key stands, nothing taken (after `decide`, which dropped lapsed leases): the
-- slots left; a slot is back when a request ends, not at a time.
function concurrency.stands(key, p, now)
  return math.max(0, p[1] - redis.call('ZCARD', key)), 0
end

function concurrency.store(key, p, now, cost, v)
  redis.call('ZADD', key, now.ms + p[3], p[4])
  redis.call('PEXPIRE', key, p[3])
end
