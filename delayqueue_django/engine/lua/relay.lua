--[[
  relay: write messages taken from a database outbox, each one once however often a relay
  brings it (one call per batch of at most SEND_BATCH_SIZE).

  A relay deletes an outbox row only after Redis accepted its message, in the database
  transaction that locked the row; if the relay dies in between, the row is relayed again.
  So this script notes each id it writes in KEYS[11], and writes nothing for an id noted
  there, even once its message was handled and acked and the queue no longer knows it. A
  relay forgets the ids whose rows it deleted, with its next call, once that transaction
  committed; an id never forgotten (its relay died without knowing whether the delete
  committed) is dropped keep_ms after it was last brought: each call notes every id it is
  brought anew, written or not, as its row may be brought again.

  KEYS: the queue's key layout (see _prelude.lua), then
    KEYS[11] relayed  zset  id -> when a relay last brought it (ms)
  ARGV[1]  wake-up channel
  ARGV[2]  keep_ms
  ARGV[3]  n, the number of messages
  ARGV[4]  f, the number of ids to forget
  then four values per message:
    id         message id
    due_ms     absolute due time in ms since the epoch; a time already past is due now
    budget     retries allowed after the first delivery
    payload    JSON text
  then the f ids to forget (their outbox rows are deleted for good).

  Returns {due_ms or -1 per message..., warnings}: -1 for a message not written, because its
  id was relayed before or is already known to the queue (it has a payload or meta record).
  Publishes the earliest due time when it is earlier than every pending message's.
]]

local relayed = keys[11]
local channel, keep_ms = args[1], tonumber(args[2])
local n, f = tonumber(args[3]), tonumber(args[4])
-- Ids noted this long ago are dropped, at most this many per call: each call stays short.
local PRUNE_LIMIT = 100

local now = now_ms()
local relayed_type = redis.call('TYPE', relayed)['ok']
if relayed_type ~= 'none' and relayed_type ~= 'zset' then
  table.insert(warnings, {relayed, 'held a ' .. relayed_type .. ' instead of a zset; ' ..
    'renamed to ' .. rename_aside(relayed, now)})
end

local forget = {}
for i = 1, f do
  forget[i] = args[4 + 4 * n + i]
end
call_chunked('ZREM', relayed, forget)
call_chunked('ZREM', relayed, redis.call('ZRANGE', relayed, '-inf', int(now - keep_ms),
  'BYSCORE', 'LIMIT', 0, PRUNE_LIMIT))

local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = args[5 + i * 4]
end
local noted = gather('ZMSCORE', relayed, ids)
local metas_found, payloads_found = gather('HMGET', metas, ids), gather('HMGET', payloads, ids)

local previous_head = head_score(pending)
local earliest = nil
local dues, scored, stored_payloads, notes = {}, {}, {}, {}
local written, taken = 0, {}
for i = 0, n - 1 do
  local id = ids[i + 1]
  -- Noted (again) whatever follows: keep_ms counts from the last time a row brought it.
  notes[2 * i + 1], notes[2 * i + 2] = int(now), id
  if noted[i + 1] or metas_found[i + 1] or payloads_found[i + 1] or taken[id] then
    dues[i + 1] = -1
  else
    taken[id] = true
    local base = 5 + i * 4
    local due = math.max(tonumber(args[base + 1]), now)
    local pair = 2 * written
    scored[pair + 1], scored[pair + 2] = int(due), id
    stored_payloads[pair + 1] = id
    stored_payloads[pair + 2] = wrap(tonumber(args[base + 2]), due, args[base + 3])
    written = written + 1
    if earliest == nil or due < earliest then
      earliest = due
    end
    dues[i + 1] = due
  end
end
call_chunked('ZADD', pending, scored)
call_chunked('HSET', payloads, stored_payloads)
call_chunked('ZADD', relayed, notes)

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
table.insert(dues, warnings)
return dues
