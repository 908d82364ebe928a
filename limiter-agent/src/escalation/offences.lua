-- One source's offences in a fleet: a sorted set of offence times (ms, server
-- clock), so that an offence on any agent counts for every agent's next one.
--
-- KEYS[1]: the set. ARGV[1]: offend | forget.
--   offend ARGV[2]: offence_memory (ms), ARGV[3]: window (ms), ARGV[4]: most kept.
--     Forgets offences older than the memory. A crossing within one window of the
--     last offence is that offence still: reply 0. Else records it and replies the
--     offences remembered, this one included (at most ARGV[4]).
--   forget: drops the history. Reply: 1 if there was one.

if ARGV[1] == 'forget' then
  return redis.call('DEL', KEYS[1])
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local memory = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - memory)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 and now - tonumber(last[2]) < tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, now)
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
redis.call('PEXPIRE', KEYS[1], memory)
return redis.call('ZCARD', KEYS[1])
