-- One idempotency entry in the fleet's Redis, with the states of the in-memory store
-- (limiter-core signature/idempotency.rs): a hash of fingerprint, owner, state
-- (in_flight | done | too_large | unknown) and, when done, the response's status,
-- headers and body. Its key id (tenant) keeps an index of its entries by expiry and
-- their sizes, so that it holds at most its share of `idempotency_max_entries` and
-- `idempotency_max_bytes`, evicting only its own settled entries.
--
-- KEYS[1]: the entry; KEYS[2]: the tenant's index (sorted set: entry key by expiry,
-- ms of Redis' clock); KEYS[3]: the tenant's sizes (hash: entry key -> bytes, and
-- "total"). Entries of the tenant other than KEYS[1] are reached through the index
-- (a single server, not a cluster).
--
-- ARGV[1]: begin | hold | complete | release | abandon; ARGV[2]: fingerprint; ARGV[3]: the
-- claim's owner token.
--   begin ARGV[4]: in-flight lease (ms), ARGV[5]: the entry's bytes, ARGV[6]: the
--     tenant's entry share, ARGV[7]: its byte share. Reply: {"proceed"} | {"full"} |
--     {"conflict"} | {"in_flight"} | {"not_replayable"} | {"unknown"} |
--     {"replay", status, headers, body}.
--   hold ARGV[4]: TTL (ms): the request was sent; the claim lasts the TTL instead of
--     the lease. Reply: 1 if it was still held.
--   complete ARGV[4]: TTL (ms), ARGV[5]: status ("" when too large to store),
--     ARGV[6]: headers, ARGV[7]: body, ARGV[8]: the byte share. Reply: 1 if the claim
--     was still held.
--   release: frees a claim whose request was never sent. Reply: 1 if it was still held.
--   abandon ARGV[4]: TTL (ms): a claim whose request was sent and got no response;
--     the outcome is unknown for the TTL. Reply: 1 if it was still held.

local op, key, index, sizes = ARGV[1], KEYS[1], KEYS[2], KEYS[3]
local fingerprint, owner = ARGV[2], ARGV[3]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- Drops `member` from the tenant's accounting.
local function untrack(member)
  local size = tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', index, member)
  if size > 0 then
    redis.call('HINCRBY', sizes, 'total', -size)
  end
end

-- Counts `member` until `expires`, with `extra` more bytes; index and sizes live as
-- long as their last entry.
local function track(member, expires, extra)
  redis.call('ZADD', index, expires, member)
  if extra > 0 then
    redis.call('HINCRBY', sizes, member, extra)
    redis.call('HINCRBY', sizes, 'total', extra)
  end
  for _, k in ipairs({ index, sizes }) do
    if redis.call('PTTL', k) < expires - now then
      redis.call('PEXPIRE', k, expires - now)
    end
  end
end

-- Drops expired entries, then evicts the tenant's settled entries, soonest to expire
-- first, until `entries` more entries and `bytes` more bytes fit its shares. False if
-- they cannot: what is left is in flight.
local function make_room(entries, bytes, entry_share, byte_share)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now)) do
    untrack(member)
  end
  local members, i = nil, 1
  while redis.call('ZCARD', index) + entries > entry_share
    or tonumber(redis.call('HGET', sizes, 'total') or '0') + bytes > byte_share do
    members = members or redis.call('ZRANGE', index, 0, -1)
    local member = members[i]
    if not member then
      return false
    end
    i = i + 1
    if redis.call('HGET', member, 'state') ~= 'in_flight' then
      redis.call('DEL', member)
      untrack(member)
    end
  end
  return true
end

local entry = redis.call('HMGET', key, 'fingerprint', 'state', 'owner', 'status', 'headers', 'body')

if op == 'begin' then
  if not entry[1] then
    -- Whatever is left of an expired entry of the same name.
    untrack(key)
    local bytes = tonumber(ARGV[5])
    if not make_room(1, bytes, tonumber(ARGV[6]), tonumber(ARGV[7])) then
      return { 'full' }
    end
    redis.call('HSET', key, 'fingerprint', fingerprint, 'state', 'in_flight', 'owner', owner)
    redis.call('PEXPIRE', key, ARGV[4])
    track(key, now + tonumber(ARGV[4]), bytes)
    return { 'proceed' }
  end
  -- A different request is wrong however often it is retried: before in_flight.
  if entry[1] ~= fingerprint then
    return { 'conflict' }
  end
  if entry[2] == 'in_flight' then
    return { 'in_flight' }
  end
  if entry[2] == 'too_large' then
    return { 'not_replayable' }
  end
  if entry[2] == 'unknown' then
    return { 'unknown' }
  end
  return { 'replay', entry[4], entry[5], entry[6] }
end

-- Only the claim's holder completes or releases it: a lapsed lease may have been
-- taken by another request since.
if entry[2] ~= 'in_flight' or entry[3] ~= owner then
  return 0
end
if op == 'release' then
  redis.call('DEL', key)
  untrack(key)
  return 1
end
local ttl = tonumber(ARGV[4])
local size = 0
if op == 'hold' then
  -- Still in flight: its index score is its expiry, which cannot be evicted early.
  redis.call('PEXPIRE', key, ttl)
  track(key, now + ttl, 0)
  return 1
elseif op == 'abandon' then
  redis.call('HSET', key, 'state', 'unknown')
else
  size = #ARGV[5] + #ARGV[6] + #ARGV[7]
  if ARGV[5] ~= '' and make_room(0, size, math.huge, tonumber(ARGV[8])) then
    redis.call('HSET', key, 'state', 'done', 'status', ARGV[5], 'headers', ARGV[6], 'body', ARGV[7])
  else
    redis.call('HSET', key, 'state', 'too_large')
    size = 0
  end
end
redis.call('PEXPIRE', key, ttl)
track(key, now + ttl, size)
return 1
