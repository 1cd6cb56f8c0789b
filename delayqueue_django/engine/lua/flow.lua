--[[
  flow: read or change a queue's flow state (see "Flow gates" in the prelude): pause,
  resume, or set the rate limit that overrides the RATE_LIMIT setting; or, on a shard of
  a sharded queue but shard 0, copy shard 0's state (engine.shard_flow).

  KEYS: the queue's key layout (see _prelude.lua); uses none of them but to name the flow
        hash (and the wake-up channel comes as ARGV)
  ARGV[1]  wake-up channel
  ARGV[2]  what to do: "read", "pause", "resume", "rate" (set ARGV[3] as the rate), or
           "copy" (take ARGV[3] and ARGV[4] as they are)
  ARGV[3]  for "rate": "<limit>:<period ms>", or "" to go back to the setting; for "copy":
           the whole queue's rate so set, which tells a fetch of this shard that the queue
           has one (the shard itself enforces none: the whole queue's budget is kept on
           shard 0, see flow_reserve.lua)
  ARGV[4]  for "copy": "1" paused, "0" not

  Returns {paused, rate, warnings}: paused 1 or 0, and the whole queue's rate set at run
  time ("" for none), as this call leaves them. A resume, or a copy that lifts a pause,
  publishes the server's time on the wake-up channel, so that idle workers fetch at once;
  so does a new rate (it may let held-back work go now). The hash is deleted once it holds
  nothing.
]]

-- Sets `field` of the flow hash to `value`, or deletes it for "".
local function put(field, value)
  if value == '' then
    call('HDEL', flow_state, field)
  else
    call('HSET', flow_state, field, value)
  end
end

local channel, action = args[1], args[2]
if action == 'pause' then
  call('HSET', flow_state, 'paused', '1')
elseif action == 'resume' then
  if call('HDEL', flow_state, 'paused') > 0 then
    wake(channel, now_ms())
  end
elseif action == 'rate' then
  put('rate', args[3])
  put('queue_rate', args[3])
  wake(channel, now_ms())
elseif action == 'copy' then
  local was = flow_reply()
  put('paused', args[4] == '1' and '1' or '')
  put('queue_rate', args[3])
  if (was[1] == 1 and args[4] ~= '1') or was[2] ~= args[3] then
    wake(channel, now_ms())
  end
end
local state = flow_reply()
return {state[1], state[2], warnings}
