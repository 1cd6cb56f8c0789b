--[[
  prune_throughput: the metrics history's upkeep (see "Metrics history" in the prelude),
  run by the workers' housekeeping. Bounded: a fixed number of keys looked at, and the
  throughput hash's field names, a few hundred at most.
    1. The minute records of each hour now wholly older than a day are added up into its
       hour record and deleted, in this call: a reader sees them in one place or the
       other, never both nor neither. The hours looked at are those of the 15 days
       before; one EXISTS of them all says when none is left (every call but one an hour).
    2. The counts a release before the history wrote in throughput ("<minute>:acked" and
       "<minute>:failed", the latter read as nacked: that release did not tell refusals,
       burials and timeouts apart) are moved into the history, and deleted; so is any
       other field but the running totals ("all:").
    3. The history's keys are given their end: a day's hour records expire 14 days after
       the day, and the current and last hour's minute records 15 days after their hour,
       so that what no prune rolls up (no worker ran) still goes.

  KEYS: the queue's key layout (see _prelude.lua); writes throughput (never the "all:"
        running totals) and the history's keys.
  ARGV: none.

  Returns {pruned, warnings}: how many hours were rolled up and old fields moved or deleted.
]]

local DAY_MS, HOUR_MS = 86400000, 3600000
local RECORD_BYTES = RECORD_BITS / 8
local FORMAT = '>I4I4I4I4I4I4I4i8'
local now = now_ms()
local current = math.floor(now / 60000)
-- The first minute whose record stays a minute's: the last day's, this one included.
local oldest_minute = current - 1439
local pruned = 0

-- The record at `index` (from 0) of a string of records: eight numbers. BITFIELD grows a
-- string only as far as the field it writes: bytes past its end read as zeros.
local function record_at(raw, index)
  local start = index * RECORD_BYTES + 1
  local bytes = string.sub(raw, start, start + RECORD_BYTES - 1)
  return {struct.unpack(FORMAT, bytes .. string.rep('\0', RECORD_BYTES - #bytes))}
end

-- Adds `record` into the hour record of `hour`, in its day's key (saturating like
-- BITFIELD), which expires 14 days after that day.
local function add_to_hour(hour, record)
  local day, index = math.floor(hour / 24), hour % 24
  local key = hour_key(day)
  local at = index * RECORD_BYTES
  local raw = redis.pcall('GETRANGE', key, at, at + RECORD_BYTES - 1)
  if failed(raw) then
    rename_foreign(key)
    raw = ''
  end
  local sum = record_at(raw, 0)
  for i = 1, 6 do
    sum[i] = math.min(sum[i] + record[i], U32_MAX)
  end
  sum[7], sum[8] = math.max(sum[7], record[7]), sum[8] + record[8]
  redis.call('SETRANGE', key, at, struct.pack(FORMAT, unpack(sum)))
  redis.call('PEXPIREAT', key, int((day + 15) * DAY_MS))
end

-- 1. Minute records rolled up.
local first_hour = math.floor(current / 60) - 15 * 24
local last_hour = math.floor(oldest_minute / 60) - 1
local candidates = {}
for hour = first_hour, last_hour do
  candidates[#candidates + 1] = minute_key(hour)
end
if redis.call('EXISTS', unpack(candidates)) > 0 then
  for i, key in ipairs(candidates) do
    local raw = redis.pcall('GET', key)
    if failed(raw) then
      rename_foreign(key)
    elseif raw then
      local sum = {0, 0, 0, 0, 0, 0, 0, 0}
      for index = 0, math.ceil(#raw / RECORD_BYTES) - 1 do
        local record = record_at(raw, index)
        for j = 1, 6 do
          sum[j] = sum[j] + record[j]
        end
        sum[7], sum[8] = math.max(sum[7], record[7]), sum[8] + record[8]
      end
      add_to_hour(first_hour + i - 1, sum)
      redis.call('DEL', key)
      pruned = pruned + 1
    end
  end
end

-- 2. The release before's per-minute fields.
local fields = call('HKEYS', throughput)
local kinds = {acked = ACKED, failed = NACKED}
for _, field in ipairs(fields) do
  if string.sub(field, 1, 4) ~= 'all:' then
    local minute, kind = string.match(field, '^(%d+):(%a+)$')
    minute = tonumber(minute)
    local n = tonumber(call('HGET', throughput, field))
    if minute and kinds[kind] and n and n > 0 and minute > current - 14 * 1440 then
      if minute >= oldest_minute then
        count_minute(minute * 60000, {kinds[kind], n})
      else
        local record = {0, 0, 0, 0, 0, 0, 0, 0}
        record[kinds[kind] + 1] = n
        add_to_hour(math.floor(minute / 60), record)
      end
    end
    call('HDEL', throughput, field)
    pruned = pruned + 1
  end
end

-- 3. The minute records' end, should no prune roll them up.
for hour = math.floor(current / 60) - 1, math.floor(current / 60) do
  redis.call('PEXPIREAT', minute_key(hour), int((hour + 1) * HOUR_MS + 15 * DAY_MS))
end
return {pruned, warnings}
