--[[
  requeue: give dead letters a new life: out of garbage, due now, with a fresh retry
  budget (the attempt count starts again from zero), without the expiry it had, its
  postpone count or its dead reason (see "Expiry and postpones" in the prelude).

  KEYS: the queue's key layout (see _prelude.lua); writes garbage, exhausted, pending, meta,
        and the key index (see "Keys" in the prelude).
  ARGV[1]  wake-up channel
  ARGV[2]  default budget, for a message whose meta record was lost
  ARGV[3…] ids

  Ids not in garbage, and ids whose payload is missing (nothing to deliver), are left as
  they are; so is a keyed dead letter whose key's message is another one, waiting (it is
  superseded, see settle_keys in the prelude). Returns {requeued_ids, warnings}.
  Publishes now when anything was requeued.
]]

local channel, default_budget = args[1], tonumber(args[2])
local now = now_ms()
local candidates, stored, seen = {}, {}, {}
for i = 3, #args do
  local id = args[i]
  if not seen[id] and call('ZSCORE', garbage, id) then
    seen[id] = true
    local payload = call('HGET', payloads, id)
    if not payload then
      table.insert(warnings, {id, 'payload missing; cannot be requeued, only deleted'})
    else
      table.insert(candidates, id)
      table.insert(stored, payload)
    end
  end
end
local superseded = {}
if #candidates > 0 and keys_used() then
  superseded = settle_keys(candidates, stored, {})
end
local requeued = {}
for _, id in ipairs(candidates) do
  if not superseded[id] then
    local lease, _, budget = read_meta(id)
    write_meta(id, (lease or 0) + 1, 0, budget or default_budget, now)
    call('ZREM', garbage, id)
    call('ZREM', exhausted, id)
    call('ZADD', pending, int(now), id)
    table.insert(requeued, id)
  end
end
-- A new life: no expiry (the operator chose to run it), no postpones, no dead reason.
forget_flow(requeued)
if #requeued > 0 then
  wake(channel, now)
end
return {requeued, warnings}
