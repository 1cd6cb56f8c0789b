--[[
  add_totals: add to running totals that workers measure themselves (handler durations
  and delivery lateness, as histogram buckets), so that every worker's figures add up.

  KEYS: the queue's key layout (see _prelude.lua); writes throughput ("all:" fields).
  ARGV[1]  n, then n pairs: name (without the "all:" prefix), increment (an integer)

  Returns {warnings}.
]]

local n = tonumber(args[1])
for i = 0, n - 1 do
  count_total(args[2 + i * 2], tonumber(args[3 + i * 2]))
end
return {warnings}
