-- Charges post-paid requests, as `MemoryStore::debit` does in memory: per bucket,
-- the units its answer cost, past the limit if need be (a debt).
--
-- KEYS: the buckets. ARGV[1]: now in us, or "" for the server's clock; then per
-- bucket: its spec's SPEC_ARGS (see `spec_at`), and the units. Reply: the number of
-- buckets.

local now = step_time(ARGV[1])

for i = 1, #KEYS do
  local at = 1 + (i - 1) * (SPEC_ARGS + 1)
  local spec = spec_at(at)
  local algorithm = ALGORITHMS[spec.algorithm]
  algorithm.debit(KEYS[i], spec, algorithm.load(KEYS[i]), now, tonumber(ARGV[at + SPEC_ARGS + 1]))
end
return #KEYS
