--[[
  add_layout: put a layout on a sharded queue's register (on shard 0) and, if it is new
  there, announce it on shard 0's wake-up channel, in one call: a process dying between
  two calls would leave the workers to find the layout only at their next reading of the
  register. Answers shard 0's flow state as the registration leaves it, which the
  layout's shards then take (engine.shard_flow): read in the same step, so that a pause
  written after it finds the layout on the register.

  KEYS: the queue's key layout of shard 0 (see _prelude.lua), none of them touched but
        to read the flow hash, then
    KEYS[11] layouts  set  the layouts (SHARDS of 2 or more) that may hold messages
  ARGV[1]  wake-up channel
  ARGV[2]  the layout
  ARGV[3]  what announces a new layout on the channel (engine.shards.LAYOUTS_CHANGED)

  Returns {added (1, or 0 if it was on the register), paused (1 or 0), the whole queue's
  rate set at run time ("" for none), warnings}.
  Publishes ARGV[3] when the layout was not on the register.
]]

local layouts = keys[11]
local added = redis.call('SADD', layouts, args[2])
if added == 1 then
  wake(args[1], tonumber(args[3]))
end
local state = flow_reply()
return {added, state[1], state[2], warnings}
