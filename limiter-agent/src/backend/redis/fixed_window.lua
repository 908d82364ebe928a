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
    if remaining == 0 then
      return rejected(spec.limit, remaining, reset_after, to_end)
    end
    return admitted(spec.limit, remaining, reset_after, to_end)
  end,
  charge = function(key, spec, state, now, _, ttl_ms)
    local w, count = fixed_window_current(spec, state, now)
    redis.call('SET', key, int(w.index) .. ' ' .. int(count + 1), 'PX', ttl_ms)
    return w.start + w.elapsed
  end,
  -- One less in the window the request was counted in, while it lasts (its key
  -- expires with it).
  refund = function(key, spec, charged_at)
    local state = load_numbers(key)
    if state and state[1] == window_at(spec, 0, charged_at).index and state[2] > 0 then
      redis.call('SET', key, int(state[1]) .. ' ' .. int(state[2] - 1), 'KEEPTTL')
    end
  end,
}
