--[[
  flow_reserve: reserve hand-outs from the whole budget of a sharded queue (issue #27), on
  shard 0, whose keys belong to every layout: so the rate limit and the cap hold for the
  whole queue, judged by shard 0's clock, however its messages lie over the shards, and a
  reshard (two layouts drained side by side) cannot double them. A sharded fetch calls it
  before asking the shards for at most what it grants (with their gates off: fetch.lua's
  mode "reserved"), and flow_settle.lua after, with what they handed out.

  Grants up to `count`: none while the queue is paused; under a rate limit (a rate set at
  run time in the flow hash, else the setting) no more than the sliding window has room
  for (window_room in the prelude), each grant logged in it at once as "<name>:<n>"; under
  a cap no more than the cap minus the live slots (flow:slots, those past their deadline
  trimmed), each grant holding a slot "<name>:<n>" until now + consume_ms. The names make
  a call repeated after a lost reply reserve the same entries again, not more.

  KEYS: the queue's key layout (see _prelude.lua): shard 0's; uses the flow keys only
  ARGV[1]  count, the most hand-outs wanted
  ARGV[2]  name, of this reservation's entries (the fetch's request)
  ARGV[3]  the RATE_LIMIT setting, "<limit>:<period ms>", or "" for none
  ARGV[4]  the MAX_IN_FLIGHT setting, 0 for none
  ARGV[5]  consume_ms, how long a reserved slot holds before it is settled

  Returns {now_ms, granted, again_ms, rate, capped, warnings}: shard 0's clock, how many
  were granted, when a fetch held back should look again (-1 when nothing held it back),
  the rate in force ("<limit>:<period ms>", "" for none), and 1 when the cap cut the grant
  (below what the rate allowed), else 0: a slot an ack frees then lets more go at once.
]]

local count, name = tonumber(args[1]), args[2]
local rate_setting, cap, consume_ms = args[3], tonumber(args[4]), tonumber(args[5])
local now = now_ms()
local fields = flow_fields()
local rate = rate_in_force(fields[2], rate_setting)
local rate_text = rate and (rate[1] .. ':' .. rate[2]) or ''
if fields[1] == '1' then
  -- A paused fetch looks again within a second: resume's wake-up may be lost.
  return {now, 0, now + 1000, rate_text, 0, warnings}
end
local granted, again, capped = count, nil, 0
if rate then
  granted, again = window_room(count, now, rate[1], rate[2])
end
if cap > 0 then
  call('ZREMRANGEBYSCORE', flow_slots, '-inf', int(now))
  local room = math.max(cap - call('ZCARD', flow_slots), 0)
  if room < granted then
    -- A slot frees on an ack (whose worker, told by `capped`, fetches again at once) or a
    -- lease running out.
    granted, again, capped = room, math.min(again or now + 1000, now + 1000), 1
  end
end
if granted > 0 and (rate or cap > 0) then
  local entries = reserved_entries(name, 1, granted)
  if rate then
    log_hand_outs(entries, now, rate[2])
  end
  if cap > 0 then
    call_chunked('ZADD', flow_slots, at_score(int(now + consume_ms), entries))
  end
end
return {now, granted, again or -1, rate_text, capped, warnings}
