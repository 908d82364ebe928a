-- GCRA, under the token bucket and the leaky bucket (limits/gcra.rs). The TAT is
-- counted in units of 1 / limit ns, stored as whole microseconds plus the units
-- within that microsecond, and the limit it was counted with: "us rem scale".

local function gcra(spec)
  local interval = spec.window_us * 1000
  return { interval = interval, tolerance = interval * spec.capacity, per_us = 1000 * spec.limit }
end

-- How far the TAT runs ahead of now, in units; 0 for a full bucket.
local function gcra_debt(spec, g, state, now)
  if not state then
    return 0
  end
  local tat_us, rem, scale = state[1], state[2], state[3]
  if scale ~= spec.limit then
    -- A reconfigured limit keeps the instant the bucket is full (rounded up).
    rem = ceil_div(rem * spec.limit, scale)
    if rem >= g.per_us then
      tat_us, rem = tat_us + 1, rem - g.per_us
    end
  end
  return math.max((tat_us - now) * g.per_us + rem, 0)
end

local function gcra_check(spec, state, now)
  local g = gcra(spec)
  local debt = gcra_debt(spec, g, state, now)
  local remaining = 0
  if g.tolerance > debt then
    remaining = floor_div(g.tolerance - debt, g.interval)
  end
  local reset_after = ceil_div(debt, spec.limit)
  local outcome
  if remaining < spec.needed then
    outcome = rejected(spec.capacity, remaining, reset_after,
                       ceil_div(debt + spec.needed * g.interval - g.tolerance, spec.limit))
  else
    outcome = admitted(spec.capacity, remaining, reset_after, ceil_div(debt + spec.upfront * g.interval, spec.limit),
                       spec.upfront)
    if spec.shaper then
      outcome.wait = reset_after
    end
  end
  outcome.debt = debt
  return outcome
end

-- Moves the TAT `units` intervals past max(TAT, now), with the key living until it.
local function gcra_take(key, spec, g, debt, now, units, ttl_ms)
  local ahead = debt + units * g.interval
  local whole = floor_div(ahead, g.per_us)
  redis.call('SET', key, int(now + whole) .. ' ' .. int(ahead - whole * g.per_us) .. ' ' .. int(spec.limit), 'PX', ttl_ms)
end

local function gcra_charge(key, spec, state, now, outcome, ttl_ms)
  gcra_take(key, spec, gcra(spec), outcome.debt, now, spec.upfront, ttl_ms)
  return now
end

-- A post-paid charge: past the tolerance if need be.
local function gcra_debit(key, spec, state, now, units)
  local g = gcra(spec)
  local debt = gcra_debt(spec, g, state, now)
  local ttl_ms = math.max(ceil_div(ceil_div(debt + units * g.interval, spec.limit), 1000000), 1)
  gcra_take(key, spec, g, debt, now, units, ttl_ms)
end

-- The TAT moves back by the cost's intervals less the time since the charge, if it
-- still holds the charge (at least that far past it) and was counted with this limit.
local function gcra_refund(key, spec, charged_at, now)
  local state = load_numbers(key)
  local late = math.max(now - charged_at, 0)
  if not state or state[3] ~= spec.limit or late * spec.limit >= spec.upfront * spec.window_us then
    return
  end
  local g = gcra(spec)
  local taken = spec.upfront * g.interval
  -- How far the TAT is past the charge, in units.
  local ahead = (state[1] - charged_at) * g.per_us + state[2]
  if ahead < taken then
    return
  end
  ahead = ahead - (taken - late * g.per_us)
  local whole = floor_div(ahead, g.per_us)
  local tat_us, rem = charged_at + whole, ahead - whole * g.per_us
  -- The key keeps the expiry of the charge, which is later: a TAT left behind the
  -- clock reads as a full bucket, and one a clock stepping back finds ahead of it
  -- again is still there, as in memory.
  redis.call('SET', key, int(tat_us) .. ' ' .. int(rem) .. ' ' .. int(spec.limit), 'KEEPTTL')
end

ALGORITHMS.token_bucket = { load = load_numbers, check = gcra_check, charge = gcra_charge, refund = gcra_refund,
                            debit = gcra_debit }
ALGORITHMS.leaky_bucket = { load = load_numbers, check = gcra_check, charge = gcra_charge, refund = gcra_refund,
                            debit = gcra_debit }
