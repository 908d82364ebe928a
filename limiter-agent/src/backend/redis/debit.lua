-- Charges post-paid requests, as `MemoryStore::debit` does in memory: per bucket,
-- the units its answer cost, past the limit if need be (a debt).
--
-- KEYS: the buckets. ARGV[1]: now in us, or "" for the server's clock; then per
-- bucket: its spec's SPEC_ARGS (see `spec_at`), and the units. Reply: per bucket, its
-- remaining units and reset (ns) once charged.

local now = step_time(ARGV[1])
local reply = {}

for i = 1, #KEYS do
  local at = 1 + (i - 1) * (SPEC_ARGS + 1)
  local spec = spec_at(at)
  local algorithm = ALGORITHMS[spec.algorithm]
  algorithm.debit(KEYS[i], spec, algorithm.load(KEYS[i]), now, tonumber(ARGV[at + SPEC_ARGS + 1]))
  local charged = algorithm.check(spec, algorithm.load(KEYS[i]), now)
  reply[#reply + 1] = charged.before_remaining
  reply[#reply + 1] = charged.before_reset
end
return reply
