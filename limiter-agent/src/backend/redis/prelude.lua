-- Shared by every algorithm script: integer arithmetic on Lua's doubles, and the
-- outcome record. The arithmetic of each algorithm is the in-memory one (see its
-- Rust module's docs), ported with times in microseconds (the resolution of Redis
-- TIME) and reported durations in nanoseconds.
--
-- Doubles hold integers exactly below 2^53; every product below stays under it as
-- long as limit x window and capacity x window do (the config refuses more for the
-- redis store). Divisions are corrected so that floating rounding cannot move a
-- quotient across an integer.

local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- floor(a * m / d), for an a * m that may pass 2^53 while a * m / d does not.
local function mul_div(a, m, d)
  local q = floor_div(a, d)
  return q * m + floor_div((a - q * d) * m, d)
end

-- Integers as Redis stores them: tostring would write 1e+15.
local function int(x)
  return string.format('%.0f', x)
end

-- An admitted request taking `units` (its cost; 0 for a post-paid one).
local function admitted(capacity, remaining, reset_after, after_reset, units)
  local left = math.max(remaining - units, 0)
  return { admitted = 1, before_remaining = remaining, before_reset = reset_after, after_remaining = left,
           after_reset = after_reset, retry = 0, used = math.max(capacity - left, 0), wait = 0 }
end

local function rejected(capacity, remaining, reset_after, retry)
  return { admitted = 0, before_remaining = remaining, before_reset = reset_after, after_remaining = remaining,
           after_reset = reset_after, retry = retry, used = capacity, wait = 0 }
end

-- A calendar window (limiter_core::calendar): of the windows between the agent's
-- boundaries (us; the previous window's start, this one's, its end, the next one's),
-- the one containing now, or the one starting at latest if that is later. Its index
-- is its start.
local function calendar_window_at(bounds, latest, now)
  local i = 1
  while i < #bounds - 1 and now >= bounds[i + 1] do
    i = i + 1
  end
  if bounds[i] < latest then
    for j = i, #bounds - 1 do
      if bounds[j] == latest then
        i = j
      end
    end
  end
  local start = bounds[i]
  return { index = start, length = bounds[i + 1] - start, start = start, elapsed = math.max(now - start, 0) }
end

-- The window [index x length, (index + 1) x length) containing now, never one before
-- latest (a clock stepping back stays at that window's start); on the calendar, as
-- calendar_window_at says.
local function window_at(spec, latest, now)
  if spec.calendar then
    return calendar_window_at(spec.calendar, latest, now)
  end
  local length = spec.window_us
  local index = math.max(floor_div(now, length), latest)
  return { index = index, length = length, start = index * length, elapsed = math.max(now - index * length, 0) }
end

-- Nanoseconds until the end of the window `ahead` windows after w.
local function until_end(w, ahead)
  return math.max(w.length * (ahead + 1) - w.elapsed, 0) * 1000
end

-- Numbers stored space-separated in one string value.
local function load_numbers(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local values = {}
  for word in string.gmatch(raw, '%S+') do
    values[#values + 1] = tonumber(word)
  end
  return values
end

-- The time of a step (us): the caller's if it gives one, else the server's.
local function step_time(given)
  if given ~= '' then
    return tonumber(given)
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- Arguments per bucket's spec.
local SPEC_ARGS = 8

-- The spec of a bucket from the SPEC_ARGS arguments after `at`: algorithm, limit,
-- window (us), capacity, shaper (1 | 0), a calendar window's boundaries (us,
-- space-separated; empty for a window of fixed length), the units a request takes
-- at admission (its cost; 0 post-paid) and the units it needs left (at least 1).
local function spec_at(at)
  local calendar = nil
  if ARGV[at + 6] ~= '' then
    calendar = {}
    for word in string.gmatch(ARGV[at + 6], '%S+') do
      calendar[#calendar + 1] = tonumber(word)
    end
  end
  return { algorithm = ARGV[at + 1], limit = tonumber(ARGV[at + 2]), window_us = tonumber(ARGV[at + 3]),
           capacity = tonumber(ARGV[at + 4]), shaper = ARGV[at + 5] == '1', calendar = calendar,
           upfront = tonumber(ARGV[at + 7]), needed = tonumber(ARGV[at + 8]) }
end

-- Each algorithm: load(key) -> state; check(spec, state, now) -> outcome;
-- charge(key, spec, state, now, outcome, ttl_ms) -> the time (us) it counted the
-- request at; refund(key, spec, charged_at, now), which gives that charge back; and
-- but the log, debit(key, spec, state, now, units), a post-paid charge.
local ALGORITHMS = {}
