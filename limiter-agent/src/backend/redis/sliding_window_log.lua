-- Sliding window log (limits/sliding_window_log.rs): a sorted set of the admitted
-- requests, scored by their times (us); member "time:n", n telling apart the requests
-- logged at one time (a clock stepping back logs at the latest time again). Each step
-- is a few O(log n) calls, never a read of the whole log: with a large limit, reading
-- it on every request made one client's traffic slow the server for the fleet.
--
-- Ranks stand for the memory log's indices: both are in time order, and every entry
-- gone from the window comes before every live one.

local function swl_score_at(key, rank)
  local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return tonumber(entry[2])
end

local function swl_logged_time(log, now)
  if log.last == nil then
    return now
  end
  return math.max(log.last, now)
end

ALGORITHMS.sliding_window_log = {
  load = function(key)
    local log = { key = key, total = redis.call('ZCARD', key) }
    if log.total > 0 then
      log.last = swl_score_at(key, -1)
    end
    return log
  end,
  check = function(spec, log, now)
    -- Live: logged after now - window.
    local count = redis.call('ZCOUNT', log.key, '(' .. int(now - spec.window_us), '+inf')
    local until_gone = function(t)
      return math.max(t + spec.window_us - now, 0) * 1000
    end
    local remaining = math.max(spec.limit - count, 0)
    local reset_after = 0
    if count > 0 then
      reset_after = until_gone(log.last)
    end
    if remaining == 0 then
      -- Of the count >= limit live entries, the first count - limit + 1 must leave:
      -- rank (total - count) + (count - limit).
      local blocking = swl_score_at(log.key, log.total - spec.limit) or now
      return rejected(spec.limit, remaining, reset_after, until_gone(blocking))
    end
    return admitted(spec.limit, remaining, reset_after, until_gone(swl_logged_time(log, now)), 1)
  end,
  charge = function(key, spec, log, now, _, ttl_ms)
    local time = int(swl_logged_time(log, now))
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - spec.window_us))
    -- Entries at `time` are the latest, so live: none was trimmed, and they are
    -- numbered 0 to n - 1.
    local n = redis.call('ZCOUNT', key, time, time)
    redis.call('ZADD', key, time, time .. ':' .. n)
    redis.call('PEXPIRE', key, ttl_ms)
    return tonumber(time)
  end,
  -- The request's entry leaves the log: the one numbered last at its time, so that
  -- the numbers stay 0 to n - 1 (entries of one time are alike).
  refund = function(key, _, charged_at)
    local time = int(charged_at)
    local n = redis.call('ZCOUNT', key, time, time)
    if n > 0 then
      redis.call('ZREM', key, time .. ':' .. int(n - 1))
    end
  end,
}
