-- Sliding window counter (limits/sliding_window_counter.rs): "window current previous".

local function swc_counts(spec, state, now)
  local latest, current, previous = 0, 0, 0
  if state then
    latest, current, previous = state[1], state[2], state[3]
  end
  local w = window_at(spec, latest, now)
  local ahead = w.index - latest
  if ahead == 1 then
    previous, current = current, 0
  elseif ahead > 1 then
    previous, current = 0, 0
  end
  return w, previous, current
end

-- The first offset (ns) into a window with these counts at which the units a
-- request needs fit, or nil.
local function swc_first_fit(spec, previous, current)
  local room = spec.limit - current - spec.needed
  if room < 0 then
    return nil
  end
  if previous == 0 then
    return 0
  end
  local length = spec.window_us * 1000
  local offset = length - mul_div(room * spec.window_us, 1000, previous)
  if offset <= 0 then
    return 0
  elseif offset < length then
    return offset
  end
  return nil
end

ALGORITHMS.sliding_window_counter = {
  load = load_numbers,
  check = function(spec, state, now)
    local w, previous, current = swc_counts(spec, state, now)
    local carried = ceil_div(previous * (w.length - math.min(w.elapsed, w.length)), w.length)
    local remaining = math.max(spec.limit - current - carried, 0)
    local reset_after = 0
    if current > 0 then
      reset_after = until_end(w, 1)
    elseif carried > 0 then
      reset_after = until_end(w, 0)
    end
    if remaining >= spec.needed then
      return admitted(spec.limit, remaining, reset_after, until_end(w, 1), spec.upfront)
    end
    local retry
    local offset = swc_first_fit(spec, previous, current)
    if offset then
      retry = math.max(offset - w.elapsed * 1000, 0)
    else
      offset = swc_first_fit(spec, current, 0)
      if offset then
        retry = until_end(w, 0) + offset
      else
        retry = until_end(w, 1)
      end
    end
    return rejected(spec.limit, remaining, reset_after, retry)
  end,
  charge = function(key, spec, state, now, _, ttl_ms)
    local w, previous, current = swc_counts(spec, state, now)
    redis.call('SET', key, int(w.index) .. ' ' .. int(current + spec.upfront) .. ' ' .. int(previous), 'PX', ttl_ms)
    return w.index * w.length + w.elapsed
  end,
  -- Past the limit if need be; the count weighs until the next window ends.
  debit = function(key, spec, state, now, units)
    local w, previous, current = swc_counts(spec, state, now)
    local ttl_ms = math.max(ceil_div(until_end(w, 1), 1000000), 1)
    redis.call('SET', key, int(w.index) .. ' ' .. int(current + units) .. ' ' .. int(previous), 'PX', ttl_ms)
  end,
  -- One less in the count of the window the request was counted in, current or
  -- previous, while it weighs.
  refund = function(key, spec, charged_at)
    local state = load_numbers(key)
    if not state then
      return
    end
    local charged = floor_div(charged_at, spec.window_us)
    local window, current, previous = state[1], state[2], state[3]
    if window == charged then
      current = math.max(current - spec.upfront, 0)
    elseif window == charged + 1 then
      previous = math.max(previous - spec.upfront, 0)
    else
      return
    end
    redis.call('SET', key, int(window) .. ' ' .. int(current) .. ' ' .. int(previous), 'KEEPTTL')
  end,
}
