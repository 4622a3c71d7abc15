"""The Lua scripts of the Redis limit book (:mod:`.redis_book`): reserve, settle, read, restore.

Each limit key is one Redis hash of ``bucket -> amount``:

* rolling minute: the bucket is the second (Redis's clock) the amount was granted in; a
  reservation sums the buckets of the last 60 seconds and deletes older ones, so a hash holds
  at most 61 buckets;
* calendar day and month (UTC): the bucket names the period (``d<days since 1970>``,
  ``M<year*12+month-1>``); the first reservation of a period deletes the buckets of earlier
  ones.

``KEYS[1]`` of every script is the epoch key: a value made once per Redis lifetime (the first
script that finds it missing sets it), returned with every grant. A settlement whose epoch is
not the current one is dropped, so a grant made before Redis restarted empty never gives back
an amount the restarted Redis does not hold.

``ARGV[1]`` is an offset in milliseconds added to Redis's clock: 0 in service; tests move a
window forward with it instead of sleeping a minute.
"""

from __future__ import annotations

__all__ = ["READ", "RESERVE", "RESTORE", "SETTLE"]

# Sets `now` (ms, Redis's clock plus the offset), `sec`, and `epoch`.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local sec = math.floor(now / 1000)
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = t[1] .. '.' .. t[2]
  redis.call('SET', KEYS[1], epoch)
end
"""

# Calendar helpers (Howard Hinnant's civil-date algorithms, proleptic Gregorian, UTC).
_CALENDAR = """
local function civil(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5)
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
-- The bucket of window `w` ('m', 'd', 'M') at `now`, and when it ends (ms).
local function bucket(w)
  if w == 'm' then return tostring(sec), 0 end
  local days = math.floor(sec / 86400)
  if w == 'd' then return 'd' .. days, (days + 1) * 86400000 end
  local y, m = civil(days)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return 'M' .. (y * 12 + m - 1), days_from_civil(ny, nm) * 86400000
end
-- Amount used in window `w` of hash `key`; for the rolling window also the live buckets,
-- oldest first. `clean`: delete the buckets that no longer count.
local function usage(key, w, field, clean)
  if w ~= 'm' then
    local v = redis.call('HGET', key, field)
    if clean and not v and redis.call('EXISTS', key) == 1 then
      local old = {}
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if f ~= 'r' .. field then old[#old + 1] = f end
      end
      if #old > 0 then redis.call('HDEL', key, unpack(old)) end
    end
    return tonumber(v or '0'), nil
  end
  local all = redis.call('HGETALL', key)
  local total, live, stale = 0, {}, {}
  for j = 1, #all, 2 do
    local s = tonumber(all[j])
    if s and s > sec - 60 then
      local v = tonumber(all[j + 1])
      total = total + v
      live[#live + 1] = {s, v}
    else
      stale[#stale + 1] = all[j]
    end
  end
  if clean and #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return total, live
end
"""

# KEYS: epoch, then one hash per use. ARGV: offset, then per use: window, amount, limit.
# Granted: {1, epoch, bucket..., used after...}. Refused: {0, index of the key, used, retry ms}.
# Numbers go back as strings (Lua numbers would be cut to integers).
RESERVE = (
    _PRELUDE
    + _CALENDAR
    + """
local n = #KEYS - 1
local fields, used = {}, {}
for i = 1, n do
  local w = ARGV[2 + (i - 1) * 3]
  local limit = tonumber(ARGV[4 + (i - 1) * 3])
  local field, ends = bucket(w)
  local total, live = usage(KEYS[i + 1], w, field, true)
  if total >= limit then
    local retry = 60000
    if w ~= 'm' then
      retry = ends - now
    else
      -- Until enough buckets left the window for the total to drop below the limit: a
      -- reservation is granted then, whatever its amount (the limit plus one request's
      -- amount is the bound), so that is when a retry succeeds (the one-process book's rule).
      local left = total
      for _, b in ipairs(live) do
        left = left - b[2]
        if left < limit then
          retry = (b[1] + 60) * 1000 - now
          break
        end
      end
    end
    return {0, i, tostring(total), tostring(math.max(retry, 1))}
  end
  fields[i], used[i] = field, total
end
local reply = {1, epoch}
for i = 1, n do
  local w = ARGV[2 + (i - 1) * 3]
  local amount = tonumber(ARGV[3 + (i - 1) * 3])
  local key = KEYS[i + 1]
  redis.call('HINCRBYFLOAT', key, fields[i], amount)
  local _, ends = bucket(w)
  if w == 'm' then
    redis.call('PEXPIRE', key, 61000)
  else
    -- A day past the period: a settlement shortly after it still finds its bucket.
    redis.call('PEXPIRE', key, ends - now + 86400000)
  end
  reply[2 + i] = fields[i]
  reply[2 + n + i] = tostring(used[i] + amount)
end
return reply
"""
)

# KEYS: epoch, then one hash per use. ARGV: offset, epoch of the grant, then per use: bucket,
# change (actual minus reserved). Returns 1 if applied, 0 if the grant is from another epoch.
# A bucket already gone (its window passed, or expired) is left alone; none goes below 0.
SETTLE = (
    _PRELUDE
    + """
if epoch ~= ARGV[2] then return 0 end
for i = 2, #KEYS do
  local field = ARGV[3 + (i - 2) * 2]
  local change = tonumber(ARGV[4 + (i - 2) * 2])
  if change ~= 0 and redis.call('HEXISTS', KEYS[i], field) == 1 then
    local v = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], field, change))
    if v < 0 then redis.call('HSET', KEYS[i], field, 0) end
  end
end
return 1
"""
)

# KEYS: epoch, then one hash per key. ARGV: offset, then per key: window. Returns used amounts.
READ = (
    _PRELUDE
    + _CALENDAR
    + """
local reply = {}
for i = 2, #KEYS do
  local w = ARGV[i]
  local field = bucket(w)
  local total = usage(KEYS[i], w, field, false)
  reply[i - 1] = tostring(total)
end
return reply
"""
)

# KEYS: epoch, then one hash per key (calendar windows only). ARGV: offset, then per key:
# window, amount. Adds each stored amount to the current period once per Redis lifetime of
# that period's bucket (a marker field `r<bucket>` remembers it), so replicas that start one
# after the other do not add it again. Returns how many keys took their amount.
RESTORE = (
    _PRELUDE
    + _CALENDAR
    + """
local added = 0
for i = 2, #KEYS do
  local w = ARGV[2 + (i - 2) * 2]
  local amount = tonumber(ARGV[3 + (i - 2) * 2])
  local field, ends = bucket(w)
  usage(KEYS[i], w, field, true)
  if redis.call('HSETNX', KEYS[i], 'r' .. field, 1) == 1 then
    redis.call('HINCRBYFLOAT', KEYS[i], field, amount)
    redis.call('PEXPIRE', KEYS[i], ends - now + 86400000)
    added = added + 1
  end
end
return added
"""
)
