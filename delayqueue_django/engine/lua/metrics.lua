--[[
  metrics: the metrics history from `since` on (read-only; see "Metrics history" in the
  prelude): the minute records of each hour, the hour records of each day, and the counts
  a release before the history wrote in throughput ("<minute>:acked" / "<minute>:failed")
  that prune_throughput has not moved yet.

  KEYS: the queue's key layout (see _prelude.lua); reads throughput and the history's keys.
  ARGV[1]  back: from how many minutes before the current one (ms // 60000 on the Redis
           clock); 15 days at most (what the history keeps, and a day's margin)

  Returns {now_ms, first_hour, minutes, first_day, hours, old, warnings}:
    minutes  one entry per hour from first_hour to the current one: its minute records
             as stored (a string of 36-byte records, cut after the last one written), or
             false
    hours    one entry per day from first_day to the current one: its hour records, or
             false
    old      flat list: minute, acked, failed, for the old fields of the last day
  A key of another type reads as none (MGET answers nil for it), as does a throughput
  that is no hash.
]]

local now = now_ms()
local current = math.floor(now / 60000)
local since = current - math.min(math.max(tonumber(args[1]), 0), 15 * 1440)
local first_hour, last_hour = math.floor(since / 60), math.floor(current / 60)
local first_day, last_day = math.floor(first_hour / 24), math.floor(last_hour / 24)

local names = {}
for hour = first_hour, last_hour do
  names[#names + 1] = minute_key(hour)
end
local minutes = redis.call('MGET', unpack(names))
names = {}
for day = first_day, last_day do
  names[#names + 1] = hour_key(day)
end
local hours = redis.call('MGET', unpack(names))

-- The release before kept at most an hour of them unless its workers were stopped: a day
-- covers any the next prune_throughput has yet to move.
local old = {}
if redis.call('TYPE', throughput)['ok'] == 'hash' then
  local fields, asked = {}, {}
  for minute = math.max(since, current - 1439), current do
    fields[#fields + 1] = int(minute) .. ':acked'
    fields[#fields + 1] = int(minute) .. ':failed'
    asked[#asked + 1] = minute
  end
  local values = {}
  for first = 1, #fields, 1000 do
    local last = math.min(first + 999, #fields)
    local part = redis.call('HMGET', throughput, unpack(fields, first, last))
    for i = 1, #part do
      values[first + i - 1] = part[i]
    end
  end
  for i, minute in ipairs(asked) do
    local acked = tonumber(values[2 * i - 1]) or 0
    local failed = tonumber(values[2 * i]) or 0
    if acked > 0 or failed > 0 then
      old[#old + 1], old[#old + 2], old[#old + 3] = minute, acked, failed
    end
  end
end
return {now, first_hour, minutes, first_day, hours, old, warnings}
