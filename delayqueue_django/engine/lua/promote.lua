--[[
  promote: make pending messages due now ("deliver now"), keeping their retry state.

  KEYS: the queue's key layout (see _prelude.lua); writes pending, meta (its due time).
  ARGV[1]  wake-up channel
  ARGV[2…] ids

  Ids not pending are left alone. Returns {promoted_ids, warnings}.
  Publishes now when anything was promoted.
]]

local channel = ARGV[1]
quarantine_foreign_keys()
local now = now_ms()
local promoted = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', pending, id) then
    redis.call('ZADD', pending, 'XX', int(now), id)
    local lease, attempt, budget = read_meta(id)
    if lease then
      write_meta(id, lease, attempt, budget, now)
    end
    table.insert(promoted, id)
  end
end
if #promoted > 0 then
  wake(channel, now)
end
return {promoted, warnings}
