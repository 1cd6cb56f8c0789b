--[[
  flow_settle: after a sharded fetch's shards answered, settle its reservation
  (flow_reserve.lua) on shard 0: the hand-outs reserved and not used are given back to the
  rate limit's window, and the reserved slots become the deliveries handed out, each
  holding its slot until its lease runs out (now + consume_ms), unless acked, refused or
  released first (flow_slots.lua).

  A shard whose reply was lost may have handed out what it was asked for: the caller counts
  that part as used, and its entries stay (in the log, and under a cap as slots, until the
  reservation's lease would run out). A shard repeating a lost request hands out again what
  it recorded, whatever the grant: what went out beyond the reservation is logged too
  ("<name>:<reserved + n>"), and its slots held like the others'. Counting a hand-out twice
  only holds the gates closed longer; never counting one would let them be exceeded.

  KEYS: the queue's key layout (see _prelude.lua): shard 0's; uses the flow keys only
  ARGV[1]  name, of the reservation's entries
  ARGV[2]  reserved, how many were granted (entries "<name>:1" to "<name>:<reserved>")
  ARGV[3]  used, how many of them the shards handed out or may have: the first `used` stay
  ARGV[4]  consume_ms
  ARGV[5]  the RATE_LIMIT setting, "<limit>:<period ms>", or "" for none
  ARGV[6]  beyond, how many the shards handed out beyond the reservation
  ARGV[7]  n, then n ids: the deliveries handed out, under a cap (none without one); the
           slots of the first n entries go to them, those of entries n + 1 to `used` stay

  Returns {now_ms, warnings}.
]]

local name, reserved, used = args[1], tonumber(args[2]), tonumber(args[3])
local consume_ms, rate_setting = tonumber(args[4]), args[5]
local beyond, n = tonumber(args[6]), tonumber(args[7])
local now = now_ms()
local unused, freed = {}, {}
for i = 1, reserved do
  local entry = name .. ':' .. i
  if i > used then
    unused[#unused + 1] = entry
  end
  if i > used or i <= n then
    freed[#freed + 1] = entry
  end
end
call_chunked('ZREM', flow_log, unused)
if beyond > 0 then
  local rate = rate_in_force(flow_fields()[2], rate_setting)
  if rate then
    log_hand_outs(reserved_entries(name, reserved + 1, reserved + beyond), now, rate[2])
  end
end
if redis.call('EXISTS', flow_slots) == 1 then
  call_chunked('ZREM', flow_slots, freed)
end
local ids = {}
for i = 1, n do
  ids[i] = args[7 + i]
end
call_chunked('ZADD', flow_slots, at_score(int(now + consume_ms), ids))
return {now, warnings}
