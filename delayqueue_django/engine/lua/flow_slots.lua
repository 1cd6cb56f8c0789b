--[[
  flow_slots: the slots of a sharded queue's MAX_IN_FLIGHT (issue #27), on shard 0 (see
  flow_reserve.lua): "free" gives back the slots of deliveries their shards acked, refused
  or released; "extend" keeps those of deliveries whose leases their shards extended until
  the new deadline (now + consume_ms, shard 0's clock). An id holding no slot is passed
  over (its slot already ran out, or it was handed out before the queue had shards).

  KEYS: the queue's key layout (see _prelude.lua): shard 0's; uses flow:slots only
  ARGV[1]  "free" or "extend"
  ARGV[2]  consume_ms
  ARGV[3]  n, then n ids

  Returns {changed, warnings}: how many slots were freed or extended.
]]

local action, consume_ms, n = args[1], tonumber(args[2]), tonumber(args[3])
local ids = {}
for i = 1, n do
  ids[i] = args[3 + i]
end
local changed = 0
if n > 0 and redis.call('EXISTS', flow_slots) == 1 then
  if action == 'free' then
    for first = 1, n, CHUNK do
      local last = math.min(first + CHUNK - 1, n)
      changed = changed + call('ZREM', flow_slots, unpack(ids, first, last))
    end
  else
    local scores, held = gather('ZMSCORE', flow_slots, ids), {}
    for i, id in ipairs(ids) do
      if scores[i] then
        held[#held + 1] = id
      end
    end
    call_chunked('ZADD', flow_slots, at_score(int(now_ms() + consume_ms), held))
    changed = #held
  end
end
return {changed, warnings}
