-- One idempotency entry in the fleet's Redis, with the states of the in-memory store
-- (signature/idempotency.rs): a hash of fingerprint, owner, state (in_flight | done |
-- too_large | unknown) and, when done, the response's status, headers and body.
--
-- KEYS[1]: the entry. ARGV[1]: begin | complete | release | abandon; ARGV[2]: fingerprint;
-- ARGV[3]: the claim's owner token.
--   begin ARGV[4]: in-flight lease (ms). Reply: {"proceed"} | {"conflict"} |
--     {"in_flight"} | {"not_replayable"} | {"unknown"} | {"replay", status, headers, body}.
--   complete ARGV[4]: TTL (ms), ARGV[5]: status ("" when too large to store),
--     ARGV[6]: headers, ARGV[7]: body. Reply: 1 if the claim was still held.
--   release: frees a claim whose request was never sent. Reply: 1 if it was still held.
--   abandon ARGV[4]: TTL (ms): a claim whose request was sent and got no response;
--     the outcome is unknown for the TTL. Reply: 1 if it was still held.

local op, key, fingerprint, owner = ARGV[1], KEYS[1], ARGV[2], ARGV[3]
local entry = redis.call('HMGET', key, 'fingerprint', 'state', 'owner', 'status', 'headers', 'body')

if op == 'begin' then
  if not entry[1] then
    redis.call('HSET', key, 'fingerprint', fingerprint, 'state', 'in_flight', 'owner', owner)
    redis.call('PEXPIRE', key, ARGV[4])
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
elseif op == 'abandon' then
  redis.call('HSET', key, 'state', 'unknown')
  redis.call('PEXPIRE', key, ARGV[4])
elseif ARGV[5] == '' then
  redis.call('HSET', key, 'state', 'too_large')
  redis.call('PEXPIRE', key, ARGV[4])
else
  redis.call('HSET', key, 'state', 'done', 'status', ARGV[5], 'headers', ARGV[6], 'body', ARGV[7])
  redis.call('PEXPIRE', key, ARGV[4])
end
return 1
