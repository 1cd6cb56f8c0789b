--[[
  totals: every running total of the queue (read-only): those the scripts count
  (acked, failed, retried, timed_out, exhausted) and those workers add (add_totals).

  KEYS: the queue's key layout (see _prelude.lua); reads throughput.
  ARGV: none.

  Returns {totals, warnings}; totals is a flat list of name (without "all:"), value; a
  value that is no integer (a foreign write) is left out, with a warning.
  Bounded: the hash holds one field per minute kept and a few hundred totals at most.
]]

local foreign = foreign_keys()
local totals = {}
if not foreign[throughput] then
  local fields = redis.call('HGETALL', throughput)
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if string.sub(name, 1, 4) == 'all:' then
      -- What HINCRBY counts: a 64-bit integer, 20 characters at most.
      if #value <= 20 and string.match(value, '^%-?%d+$') then
        table.insert(totals, string.sub(name, 5))
        table.insert(totals, value)
      else
        table.insert(warnings, {throughput, 'field ' .. name .. ' holds no integer; left out'})
      end
    end
  end
end
return {totals, warnings}
