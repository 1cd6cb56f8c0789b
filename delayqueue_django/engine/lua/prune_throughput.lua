--[[
  prune_throughput: forget per-minute counts older than `keep_minutes` minutes. Bounded:
  it reads the hash's field names, which pruning keeps to a few hundred at most.

  KEYS: the queue's key layout (see _prelude.lua); writes throughput (never the "all:"
        running totals).
  ARGV[1]  keep_minutes

  Returns {pruned, warnings}: how many fields were deleted.
]]

local keep_minutes = tonumber(args[1])
local oldest_kept = math.floor(now_ms() / 60000) - keep_minutes + 1
local pruned = 0
for _, field in ipairs(call('HKEYS', throughput)) do
  local minute = tonumber(string.match(field, '^(%d+):'))
  local total = string.sub(field, 1, 4) == 'all:'
  if not total and (minute == nil or minute < oldest_kept) then
    call('HDEL', throughput, field)
    pruned = pruned + 1
  end
end
return {pruned, warnings}
