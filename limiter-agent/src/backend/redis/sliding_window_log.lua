-- Sliding window log (limits/sliding_window_log.rs): a list of the admitted
-- requests' times (us), oldest first.

local function swl_first_live(spec, times, now)
  local first = 0
  while first < #times and times[first + 1] + spec.window_us <= now do
    first = first + 1
  end
  return first
end

local function swl_logged_time(times, now)
  if #times == 0 then
    return now
  end
  return math.max(times[#times], now)
end

ALGORITHMS.sliding_window_log = {
  load = function(key)
    local times = redis.call('LRANGE', key, 0, -1)
    for i = 1, #times do
      times[i] = tonumber(times[i])
    end
    return times
  end,
  check = function(spec, times, now)
    local first = swl_first_live(spec, times, now)
    local count = #times - first
    local until_gone = function(t)
      return math.max(t + spec.window_us - now, 0) * 1000
    end
    local remaining = math.max(spec.limit - count, 0)
    local reset_after = 0
    if count > 0 then
      reset_after = until_gone(times[#times])
    end
    if remaining == 0 then
      local blocking = times[first + (count - spec.limit) + 1] or now
      return rejected(spec.limit, remaining, reset_after, until_gone(blocking))
    end
    return admitted(spec.limit, remaining, reset_after, until_gone(swl_logged_time(times, now)))
  end,
  charge = function(key, spec, times, now, _, ttl_ms)
    local first = swl_first_live(spec, times, now)
    local time = swl_logged_time(times, now)
    if first > 0 then
      redis.call('LTRIM', key, first, -1)
    end
    redis.call('RPUSH', key, int(time))
    redis.call('PEXPIRE', key, ttl_ms)
  end,
}
