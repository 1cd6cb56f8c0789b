--[[
  ended: the outcome record of a message that ended (read-only; see "Outcome records" in
  _prelude.lua), by its id or by its key.

  KEYS: the queue's key layout (see _prelude.lua); reads the outcome records derived from
        its tag.
  ARGV[1]  "id" or "key"
  ARGV[2]  the id, or the key

  Returns {id, record, warnings}: the id ("" when none) and its record as stored (false
  when there is none, or it expired). A record's key holding another type than a string
  (a foreign write) reads as an empty record, which the client shows as damaged; a key's
  such key as none; either with a warning.
]]

local tag = string.sub(payloads, 1, -8)

local function read(name)
  local value = redis.pcall('GET', name)
  if type(value) == 'table' then
    table.insert(warnings, {name, 'holds another type than a string'})
    return ''
  end
  return value
end

local id = args[2]
if args[1] == 'key' then
  id = read(tag .. 'ended_key:' .. args[2])
  if not id or id == '' then
    return {'', false, warnings}
  end
end
return {id, read(tag .. 'ended:' .. id), warnings}
