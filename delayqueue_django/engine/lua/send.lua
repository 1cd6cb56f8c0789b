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

local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[3 + i * 5]
end

-- Check the whole batch before writing anything, so a refused batch leaves no trace.
-- The first message found known to the queue with another payload (or with a meta
-- record but no payload) refuses the batch.
local stored, known = gather('HMGET', payloads, ids), gather('HMGET', metas, ids)
local replayed = {}
for i = 0, n - 1 do
  local payload = ARGV[7 + i * 5]
  if stored[i + 1] == payload then
    replayed[i] = true
  elseif stored[i + 1] or known[i + 1] then
    return redis.error_reply('DUPLICATE ' .. ids[i + 1])
  end
end

-- A replay's due time is its pending score if it is still pending, else now. Read before
-- the writes below, which cannot touch it: an id the batch writes was unknown to the queue,
-- while a replayed one is stored.
local replays = {}
for i = 0, n - 1 do
  if replayed[i] then
    table.insert(replays, ids[i + 1])
  end
end
local replay_scores = gather('ZMSCORE', pending, replays)

-- Then every new message is written with one ZADD and two HSETs. An id given twice in
-- the batch (Queue never does: it makes the ids) is written twice and the later entry
-- wins, as with one call per message; the reply still has a due time for each entry, and
-- the earlier entry's due time still counts for the wake-up.
local previous_head = head_score(pending)
local earliest = nil
local dues, scored, stored_payloads, records = {}, {}, {}, {}
local replay, written = 0, 0
for i = 0, n - 1 do
  local base = 3 + i * 5
  local id, at_ms, delay_ms = ids[i + 1], ARGV[base + 1], ARGV[base + 2]
  local budget, payload = tonumber(ARGV[base + 3]), ARGV[base + 4]
  local due
  if at_ms ~= '' then
    due = tonumber(at_ms)
  else
    due = now + tonumber(delay_ms)
  end
  if replayed[i] then
    replay = replay + 1
    due = tonumber(replay_scores[replay]) or now
  else
    -- Appended by index, which costs Lua a fraction of table.insert's call.
    local pair = 2 * written
    scored[pair + 1], scored[pair + 2] = int(due), id
    stored_payloads[pair + 1], stored_payloads[pair + 2] = id, payload
    records[pair + 1], records[pair + 2] = id, format_meta(0, 0, budget, due)
    written = written + 1
    if earliest == nil or due < earliest then
      earliest = due
    end
  end
  dues[i + 1] = due
end
call_chunked('ZADD', pending, scored)
call_chunked('HSET', payloads, stored_payloads)
call_chunked('HSET', metas, records)

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
table.insert(dues, warnings)
return dues
