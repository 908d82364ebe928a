-- Fixed window (limits/fixed_window.rs): "window count".

local function fixed_window_current(spec, state, now)
  local latest, count = 0, 0
  if state then
    latest, count = state[1], state[2]
  end
  local w = window_at(spec, latest, now)
  if w.index ~= latest then
    count = 0
  end
  return w, count
end

ALGORITHMS.fixed_window = {
  load = load_numbers,
  check = function(spec, state, now)
    local w, count = fixed_window_current(spec, state, now)
    local remaining = math.max(spec.limit - count, 0)
    local to_end = until_end(w, 0)
    local reset_after = 0
    if count > 0 then
      reset_after = to_end
    end
    if remaining < spec.needed then
      return rejected(spec.limit, remaining, reset_after, to_end)
    end
    return admitted(spec.limit, remaining, reset_after, to_end, spec.upfront)
  end,
  charge = function(key, spec, state, now, _, ttl_ms)
    local w, count = fixed_window_current(spec, state, now)
    redis.call('SET', key, int(w.index) .. ' ' .. int(count + spec.upfront), 'PX', ttl_ms)
    return w.start + w.elapsed
  end,
  -- Past the limit if need be, until the window ends.
  debit = function(key, spec, state, now, units)
    local w, count = fixed_window_current(spec, state, now)
    local ttl_ms = math.max(ceil_div(until_end(w, 0), 1000000), 1)
    redis.call('SET', key, int(w.index) .. ' ' .. int(count + units), 'PX', ttl_ms)
  end,
  -- The cost less in the window the request was counted in, while it lasts (its key
  -- expires with it).
  refund = function(key, spec, charged_at)
    local state = load_numbers(key)
    if state and state[1] == window_at(spec, 0, charged_at).index and state[2] > 0 then
      redis.call('SET', key, int(state[1]) .. ' ' .. int(math.max(state[2] - spec.upfront, 0)), 'KEEPTTL')
    end
  end,
}
