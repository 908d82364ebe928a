-- One request against every bucket: check them all, then charge all of them if
-- every one admits ("all"), or each one that admits ("each"), or none ("none": what
-- `limiter explain` shows), as `MemoryStore::apply` does in memory.
--
-- KEYS: the buckets. ARGV[1]: "all" | "each" | "none"; ARGV[2]: now in us, or "" for the
-- server's clock; then per bucket: algorithm, limit, window (us), capacity, shaper
-- (1 | 0), calendar boundaries (see spec_at), units taken at admission, units needed. Reply: per bucket, admitted, before remaining, before reset (ns), after
-- remaining, after reset (ns), retry after (ns), used, wait (ns), and the time (us)
-- the charge counted the request at, which `refund.lua` takes (-1: not charged).

local now = step_time(ARGV[2])

local buckets, all_admit = {}, true
for i = 1, #KEYS do
  local spec = spec_at(2 + (i - 1) * SPEC_ARGS)
  local algorithm = ALGORITHMS[spec.algorithm]
  local state = algorithm.load(KEYS[i])
  local outcome = algorithm.check(spec, state, now)
  all_admit = all_admit and outcome.admitted == 1
  buckets[i] = { spec = spec, algorithm = algorithm, state = state, outcome = outcome }
end

local reply = {}
for i, b in ipairs(buckets) do
  local o = b.outcome
  local charged_at = -1
  if o.admitted == 1 and ((all_admit and ARGV[1] == 'all') or ARGV[1] == 'each') then
    -- The state is dropped when the bucket is back to full: a missing bucket is full.
    charged_at = b.algorithm.charge(KEYS[i], b.spec, b.state, now, o, math.max(ceil_div(o.after_reset, 1000000), 1))
  end
  for _, v in ipairs({ o.admitted, o.before_remaining, o.before_reset, o.after_remaining, o.after_reset, o.retry,
                       o.used, o.wait, charged_at }) do
    reply[#reply + 1] = v
  end
end
return reply
