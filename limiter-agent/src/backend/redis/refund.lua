-- Gives charges back, as `MemoryStore::refund` does in memory: per bucket, the charge
-- `apply.lua` counted the request at, as each algorithm's refund says.
--
-- KEYS: the buckets. ARGV[1]: now in us, or "" for the server's clock; then per
-- bucket: its spec's SPEC_ARGS (see `spec_at`), and the time (us)
-- `apply.lua` replied the charge counted at. Reply: the number of buckets.

local now = step_time(ARGV[1])

for i = 1, #KEYS do
  local at = 1 + (i - 1) * (SPEC_ARGS + 1)
  local spec = spec_at(at)
  ALGORITHMS[spec.algorithm].refund(KEYS[i], spec, tonumber(ARGV[at + SPEC_ARGS + 1]), now)
end
return #KEYS
