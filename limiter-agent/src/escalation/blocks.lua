-- Active escalation penalties of a fleet: a sorted set by expiry (ms, server
-- clock), trimmed of lapsed ones on every call. One set holds the blocks (members
-- "CIDR"), another the demotions ("demote CIDR PPS BURST").
--
-- KEYS[1]: the set. ARGV[1]: add | list.
--   add ARGV[2]: member, ARGV[3]: TTL (ms), ARGV[4]: channel. Records the penalty
--     (a later expiry wins) and publishes "MEMBER TTL" on the channel. Reply:
--     receivers.
--   list: Reply: {member, ms left, ...}.

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
