--[[
  requeue: give dead letters a new life: out of garbage, due now, with a fresh retry
  budget (the attempt count starts again from zero).

  KEYS: the queue's key layout (see _prelude.lua); writes garbage, exhausted, pending, meta.
  ARGV[1]  wake-up channel
  ARGV[2]  default budget, for a message whose meta record was lost
  ARGV[3…] ids

  Ids not in garbage, and ids whose payload is missing (nothing to deliver), are left as
  they are. Returns {requeued_ids, warnings}. Publishes now when anything was requeued.
]]

local channel, default_budget = args[1], tonumber(args[2])
local now = now_ms()
local requeued = {}
for i = 3, #args do
  local id = args[i]
  if call('ZSCORE', garbage, id) then
    if call('HEXISTS', payloads, id) == 0 then
      table.insert(warnings, {id, 'payload missing; cannot be requeued, only deleted'})
    else
      local lease, _, budget = read_meta(id)
      write_meta(id, (lease or 0) + 1, 0, budget or default_budget, now)
      call('ZREM', garbage, id)
      call('ZREM', exhausted, id)
      call('ZADD', pending, int(now), id)
      table.insert(requeued, id)
    end
  end
end
if #requeued > 0 then
  wake(channel, now)
end
return {requeued, warnings}
