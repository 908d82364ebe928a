-- Active escalation blocks of a fleet: a sorted set of CIDRs by expiry (ms, server
-- clock), trimmed of lapsed ones on every call.
--
-- KEYS[1]: the set. ARGV[1]: add | list.
--   add ARGV[2]: CIDR, ARGV[3]: TTL (ms), ARGV[4]: channel. Records the block (a
--     later expiry wins) and publishes "CIDR TTL" on the channel. Reply: receivers.
--   list: Reply: {CIDR, ms left, ...}.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

if ARGV[1] == 'add' then
  local ttl = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[2])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return redis.call('PUBLISH', ARGV[4], ARGV[2] .. ' ' .. ARGV[3])
end

local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local reply = {}
for i = 1, #entries, 2 do
  reply[#reply + 1] = entries[i]
  reply[#reply + 1] = string.format('%.0f', tonumber(entries[i + 1]) - now)
end
return reply
