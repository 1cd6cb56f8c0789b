--[[
  throughput: acked and failed deliveries per minute, for the last `minutes` minutes
  (read-only). Failed counts refusals (nack, bury) and deliveries that timed out.

  KEYS: the queue's key layout (see _prelude.lua); reads throughput.
  ARGV[1]  minutes, how many whole minutes back from the current one

  Returns {now_ms, counts, warnings}; counts is a flat list, oldest minute first:
    minute (ms // 60000 on the Redis clock), acked, failed
]]

local minutes = tonumber(args[1])
local foreign = foreign_keys()
local now = now_ms()
local current = math.floor(now / 60000)
local counts = {}
for minute = current - minutes + 1, current do
  local acked, failed = 0, 0
  if not foreign[throughput] then
    -- A count that is no number (a foreign write) reads as 0.
    acked = tonumber(redis.call('HGET', throughput, int(minute) .. ':acked')) or 0
    failed = tonumber(redis.call('HGET', throughput, int(minute) .. ':failed')) or 0
  end
  table.insert(counts, minute)
  table.insert(counts, acked)
  table.insert(counts, failed)
end
return {now, counts, warnings}
