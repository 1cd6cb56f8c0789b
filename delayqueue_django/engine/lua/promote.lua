--[[
  promote: make pending messages due now ("deliver now"), keeping their retry state.

  KEYS: the queue's key layout (see _prelude.lua); writes pending, meta (its due time; a
        message never handed out gets its first record).
  ARGV[1]  wake-up channel
  ARGV[2…] ids

  Ids not pending are left alone. Returns {promoted_ids, warnings}.
  Publishes now when anything was promoted.
]]

local channel = args[1]
local now = now_ms()
local promoted = {}
for i = 2, #args do
  local id = args[i]
  if call('ZSCORE', pending, id) then
    call('ZADD', pending, 'XX', int(now), id)
    local lease, attempt, budget = read_meta(id)
    if not lease and call('HEXISTS', metas, id) == 0 then
      -- Never handed out: its due time is kept with its payload, its record made now.
      lease, attempt, budget = parse_meta(first_meta(call('HGET', payloads, id)))
    end
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
