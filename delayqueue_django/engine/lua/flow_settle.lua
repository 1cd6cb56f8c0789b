--[[
  flow_settle: after a sharded fetch's shards answered, settle its reservation
  (flow_reserve.lua) on shard 0: the hand-outs reserved and not used are given back to the
  rate limit's window, and the reserved slots become the deliveries handed out, each
  holding its slot until its lease runs out (now + consume_ms), unless acked, refused or
  released first (flow_slots.lua).

  KEYS: the queue's key layout (see _prelude.lua): shard 0's; uses the flow keys only
  ARGV[1]  name, of the reservation's entries
  ARGV[2]  reserved, how many were granted (entries "<name>:1" to "<name>:<reserved>")
  ARGV[3]  used, how many the shards handed out: the log keeps the first `used` entries
  ARGV[4]  consume_ms
  ARGV[5]  n, then n ids: the deliveries handed out, under a cap (none without one)

  Returns {now_ms, warnings}.
]]

local name, reserved, used = args[1], tonumber(args[2]), tonumber(args[3])
local consume_ms, n = tonumber(args[4]), tonumber(args[5])
local now = now_ms()
local unused, placeholders = {}, {}
for i = 1, reserved do
  placeholders[i] = name .. ':' .. i
  if i > used then
    unused[#unused + 1] = placeholders[i]
  end
end
call_chunked('ZREM', flow_log, unused)
if redis.call('EXISTS', flow_slots) == 1 then
  call_chunked('ZREM', flow_slots, placeholders)
end
local ids = {}
for i = 1, n do
  ids[i] = args[5 + i]
end
call_chunked('ZADD', flow_slots, at_score(int(now + consume_ms), ids))
return {now, warnings}
