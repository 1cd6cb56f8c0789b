--[[
  holds_key: whether the key is this queue's (read-only): the key index names a message
  with it (in any state, as lookup finds one), or a unique_for hold on it lasts. A sharded
  queue asks it of the key's shards of its other layouts to find where the key lives (see
  engine/sharded_store.py: a key's home): a hold whose message has gone still keeps the
  key there, until it ends.

  KEYS: the queue's key layout (see _prelude.lua); reads the key index and the key's hold
        only.
  ARGV[1]  key

  Returns {1 (held) or 0, warnings}.
]]

local key = args[1]
local id = redis.pcall('HGET', key_index, key)
if type(id) == 'table' then
  table.insert(warnings, {key_index, 'holds another type than a hash'})
  id = false
end
if id then
  return {1, warnings}
end
local hold = redis.call('EXISTS', hold_prefix .. key)
return {hold == 1 and 1 or 0, warnings}
