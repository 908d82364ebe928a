-- The signatures one key id has used, in the fleet's Redis: a sorted set of MACs
-- (lowercase hex) scored by the time (ms) after which their request can no longer
-- pass the timestamp check. The set bounds the key id to its share of
-- `replay_cache_size`, as the in-memory cache does (limiter-core signature/replay.rs).
--
-- A MAC once recorded stays until it expires, whatever became of its request.
-- Expiry is by the server's clock: by the agents' own, the one whose clock ran
-- fastest would drop MACs every other agent still accepts, and so let them be
-- replayed there.
--
-- KEYS[1]: the key id's set. ARGV[1]: the MAC, ARGV[2]: expiry (ms), ARGV[3]: the
-- share. Reply: "ok" | "replay" | "full".

local key, mac = KEYS[1], ARGV[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires, share = tonumber(ARGV[2]), tonumber(ARGV[3])
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
