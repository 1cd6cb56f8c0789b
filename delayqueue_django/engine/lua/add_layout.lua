--[[
  add_layout: put a layout on a sharded queue's register (on shard 0) and, if it is new
  there, announce it on shard 0's wake-up channel, in one call: a process dying between
  two calls would leave the workers to find the layout only at their next reading of the
  register. Answers shard 0's flow state as the registration leaves it, which the
  layout's shards then take (engine.shard_flow): read in the same step, so that a pause
  written after it finds the layout on the register.

  Layout 1 (the queue's own keys: shard 0 alone) joins the register with the first layout
  put on an empty one, when the queue has had a keyed message (the key index exists): a
  process of more shards puts its layout on the register before any write, so those keys
  were sent by processes of one shard. They wait on shard 0, where a new layout looks for
  few of them unless layout 1 is on the register (see engine/sharded_store.py: a key's
  home). A keyed send of one shard after this step finds the register no longer empty,
  and registers layout 1 itself (engine.shard_layouts).

  KEYS: the queue's key layout of shard 0 (see _prelude.lua), none of them touched but
        to read the flow hash, then
    KEYS[11] layouts  set  the layouts that may hold messages (SHARDS of 2 or more, and 1
                           while keys sent under one shard may wait on shard 0)
  ARGV[1]  wake-up channel
  ARGV[2]  the layout
  ARGV[3]  what announces a new layout on the channel (engine.shards.LAYOUTS_CHANGED)

  Returns {added (1, or 0 if it was on the register), paused (1 or 0), the whole queue's
  rate set at run time ("" for none), warnings}; reads the key index's existence when the
  layout is the register's first.
  Publishes ARGV[3] when the layout was not on the register.
]]

local layouts = keys[11]
local added = redis.call('SADD', layouts, args[2])
if added == 1 then
  if args[2] ~= '1' and redis.call('SCARD', layouts) == 1 and keys_used() then
    redis.call('SADD', layouts, '1')
  end
  wake(args[1], tonumber(args[3]))
end
local state = flow_reply()
return {added, state[1], state[2], warnings}
