--[[
  send: schedule a batch of new messages (one call per batch of at most SEND_BATCH_SIZE).

  KEYS: the queue's key layout (see _prelude.lua); writes pending, payload, meta.
  ARGV[1]  wake-up channel
  ARGV[2]  n, the number of messages
  then, five values per message:
    id         message id (must be new to the queue)
    at_ms      absolute due time in ms since the epoch, or "" to use delay_ms
    delay_ms   delay in ms counted from the Redis server's clock (used when at_ms is "")
    budget     retries allowed after the first delivery
    payload    JSON text

  Returns {due_ms..., warnings}: the due time given to each message, in order.
  Errors (nothing written): "DUPLICATE <id>" if an id is already known to the queue with
  another payload (or without one).
  A message whose id is already stored with this very payload is a replay of a send whose
  reply was lost (clients re-send after a timeout or a cut connection): it is left as it
  is, and its due time is its pending score if it is still pending, else now.
  Publishes the earliest due time when it is earlier than every pending message's.
]]

local channel, n = ARGV[1], tonumber(ARGV[2])
quarantine_foreign_keys()
local now = now_ms()

-- Check the whole batch before writing anything, so a refused batch leaves no trace.
local replayed = {}
for i = 0, n - 1 do
  local id, payload = ARGV[3 + i * 5], ARGV[7 + i * 5]
  local stored = redis.call('HGET', payloads, id)
  if stored == payload then
    replayed[i] = true
  elseif stored or redis.call('HEXISTS', metas, id) == 1 then
    return redis.error_reply('DUPLICATE ' .. id)
  end
end

local previous_head = head_score(pending)
local earliest = nil
local dues = {}
for i = 0, n - 1 do
  local base = 3 + i * 5
  local id, at_ms, delay_ms = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local budget, payload = tonumber(ARGV[base + 3]), ARGV[base + 4]
  local due
  if at_ms ~= '' then
    due = tonumber(at_ms)
  else
    due = now + tonumber(delay_ms)
  end
  if replayed[i] then
    due = tonumber(redis.call('ZSCORE', pending, id)) or now
  else
    redis.call('ZADD', pending, int(due), id)
    redis.call('HSET', payloads, id, payload)
    write_meta(id, 0, 0, budget, due)
    if earliest == nil or due < earliest then
      earliest = due
    end
  end
  dues[i + 1] = due
end

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
table.insert(dues, warnings)
return dues
