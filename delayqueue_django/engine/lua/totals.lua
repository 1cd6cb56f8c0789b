--[[
  totals: every running total of the queue (read-only): those the scripts count
  (acked, failed, retried, timed_out, exhausted) and those workers add (add_totals).

  KEYS: the queue's key layout (see _prelude.lua); reads throughput.
  ARGV: none.

  Returns {totals, warnings}; totals is a flat list of name (without "all:"), value.
  Bounded: the hash holds one field per minute kept and a few hundred totals at most.
]]

local foreign = foreign_keys()
local totals = {}
if not foreign[throughput] then
  local fields = redis.call('HGETALL', throughput)
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 4) == 'all:' then
      table.insert(totals, string.sub(fields[i], 5))
      table.insert(totals, fields[i + 1])
    end
  end
end
return {totals, warnings}
