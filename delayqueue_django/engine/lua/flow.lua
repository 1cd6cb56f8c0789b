--[[
  flow: read or change a queue's flow state (see "Flow gates" in the prelude): pause,
  resume, or set the rate limit that overrides the RATE_LIMIT setting.

  KEYS: the queue's key layout (see _prelude.lua); uses none of them but to name the flow
        hash (and the wake-up channel comes as ARGV)
  ARGV[1]  wake-up channel
  ARGV[2]  what to do: "read", "pause", "resume", or "rate" (set ARGV[3] as the rate)
  ARGV[3]  for "rate": "<limit>:<period ms>", or "" to go back to the setting: the rate
           this queue enforces ("" on a shard of a sharded queue other than shard 0, where
           the whole queue's budget is kept: see flow_reserve.lua)
  ARGV[4]  for "rate": the whole queue's rate, as ARGV[3], which reads answer and which
           tells a fetch of a shard that the queue has one

  Returns {paused, rate, warnings}: paused 1 or 0, and the whole queue's rate set at run
  time ("" for none), as this call leaves them. Resume publishes the server's time on the wake-up
  channel, so that idle workers fetch at once. The hash is deleted once it holds nothing.
]]

local channel, action = args[1], args[2]
if action == 'pause' then
  call('HSET', flow_state, 'paused', '1')
elseif action == 'resume' then
  if call('HDEL', flow_state, 'paused') > 0 then
    wake(channel, now_ms())
  end
elseif action == 'rate' then
  for _, field in ipairs({{'rate', args[3]}, {'queue_rate', args[4]}}) do
    if field[2] == '' then
      call('HDEL', flow_state, field[1])
    else
      call('HSET', flow_state, field[1], field[2])
    end
  end
  -- A new rate may let held-back work go now.
  wake(channel, now_ms())
end
local fields = {false, false}
if redis.call('TYPE', flow_state)['ok'] == 'hash' then
  fields = redis.call('HMGET', flow_state, 'paused', 'queue_rate')
end
return {fields[1] == '1' and 1 or 0, fields[2] or '', warnings}
