--[[
  lookup: the key's message, where it is and what it holds (read-only): the message the key
  index names (see "Keys" in _prelude.lua): the key's waiting message if one waits, else
  the latest sent with the key while it is still stored (in flight or dead).

  KEYS: the queue's key layout (see _prelude.lua); reads all but quarantine, and the key
        index.
  ARGV[1]  key
  ARGV[2]  optional preview_bytes, as peek's

  Returns {id, state, score, payload, size, meta, unannounced, group, reason, warnings}: the message's
  id ("" when the key names no message) and then peek's reply for it.
]]

local key, preview_bytes = args[1], tonumber(args[2])
local foreign = foreign_keys()
local id = redis.pcall('HGET', key_index, key)
if type(id) == 'table' then
  table.insert(warnings, {key_index, 'holds another type than a hash'})
  id = false
end
if not id then
  return {'', '', -1, false, 0, false, 0, warnings}
end
local described = describe(id, preview_bytes, foreign)
table.insert(described, 1, id)
return described
