-- The signatures one key id has used, in the fleet's Redis: a sorted set of MACs
-- (lowercase hex) scored by the time (ms) after which their request can no longer
-- pass the timestamp check. The set bounds the key id to its share of
-- `replay_cache_size`, as the in-memory cache does (limiter-core signature/replay.rs).
--
-- KEYS[1]: the key id's set. ARGV[1]: insert | forget; ARGV[2]: the MAC.
--   insert ARGV[3]: now (ms), ARGV[4]: expiry (ms), ARGV[5]: the share.
--     Reply: "ok" | "replay" | "full".
--   forget: removes the MAC. Reply: 1 if it was there.

local key, op, mac = KEYS[1], ARGV[1], ARGV[2]
if op == 'forget' then
  return redis.call('ZREM', key, mac)
end

local now, expires, share = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZSCORE', key, mac) then
  return 'replay'
end
if redis.call('ZCARD', key) >= share then
  return 'full'
end
redis.call('ZADD', key, expires, mac)
-- The set lives as long as its last entry.
if redis.call('PTTL', key) < expires - now then
  redis.call('PEXPIRE', key, expires - now)
end
return 'ok'
