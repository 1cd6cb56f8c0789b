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
  then eight values per message:
    id         message id
    due_ms     absolute due time in ms since the epoch; a time already past is due now
    budget     retries allowed after the first delivery
    payload    JSON text
    key        the message's key (see send_keyed.lua), or "" for a message without one
    if_exists  a keyed message's: keep or replace (error is refused at the send: a relay
               has no caller to raise it to)
    unique_ms  a keyed message's hold, as send_keyed's (0: none)
    group      the message's ordered group (see the prelude), or "" for none; a keyed
               one's as send_keyed's (see regroup in the prelude)
  then the f ids to forget (their outbox rows are deleted for good);
  then, optionally, the messages' expiries, as send's (see send.lua): never refused, as a
  relay has no caller to refuse to; a message relayed at or after its expiry is
  dead-lettered as expired by the first fetch that stages it;
  then, optionally (the expiries' count, 0 for none, comes first), r, the number of keyed
  messages that carry their outbox row, and r triples: the message's place (from 1), the
  row's database (its alias) and its id there.

  A keyed message not relayed before is decided as send_keyed decides it (the prelude's
  send_keys), the keyed messages of a call in their order, which is their rows' order: it
  may create a message, replace the key's waiting message, or write nothing (the key's
  waiting message kept, or a hold). A replace row older than the row of its database that
  last created or replaced the key's waiting message (another relay brought that one
  first) writes nothing: see "Outbox rows" in the prelude. Its id is noted all the same, so
  a row brought again never decides twice.

  Returns {due_ms or -1 per message..., warnings}: -1 for a message not written, because its
  id was relayed before or is already known to the queue (it has a payload or meta record),
  or, keyed, it was kept or held; a keyed message that replaced the key's waiting message
  answers that message's new due time.
  Publishes the earliest due time when it is earlier than every pending message's.
]]

local relayed = keys[11]
local channel, keep_ms = args[1], tonumber(args[2])
local n, f = tonumber(args[3]), tonumber(args[4])
local WIDTH = 8
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
  forget[i] = args[4 + WIDTH * n + i]
end
call_chunked('ZREM', relayed, forget)
call_chunked('ZREM', relayed, redis.call('ZRANGE', relayed, '-inf', int(now - keep_ms),
  'BYSCORE', 'LIMIT', 0, PRUNE_LIMIT))

local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = args[5 + i * WIDTH]
end
local expiries_at = 5 + WIDTH * n + f
local expiring = read_expiries(args, expiries_at, now)
-- The keyed messages' rows, by place: {database, id}.
local rows_at = expiries_at + 1 + 3 * (tonumber(args[expiries_at] or '0') or 0)
local rows = {}
for i = 1, tonumber(args[rows_at] or '0') or 0 do
  local base = rows_at + (i - 1) * 3
  rows[tonumber(args[base + 1])] = {database = args[base + 2], id = args[base + 3]}
end
local expiry_scored = {}
local noted = gather('ZMSCORE', relayed, ids)
local metas_found, payloads_found = gather('HMGET', metas, ids), gather('HMGET', payloads, ids)

local previous_head = head_score(pending)
local earliest = nil
local dues, scored, stored_payloads, notes = {}, {}, {}, {}
local written, taken, grouped = 0, {}, {}
-- The keyed messages to decide (send_keys's items), and each one's place in the reply.
local keyed, keyed_at = {}, {}
for i = 0, n - 1 do
  local id = ids[i + 1]
  -- Noted (again) whatever follows: keep_ms counts from the last time a row brought it.
  notes[2 * i + 1], notes[2 * i + 2] = int(now), id
  local base = 5 + i * WIDTH
  local key = args[base + 4]
  if noted[i + 1] or metas_found[i + 1] or payloads_found[i + 1] or taken[id] then
    dues[i + 1] = -1
  elseif key ~= '' then
    taken[id] = true
    table.insert(keyed, {id = id, key = key, mode = args[base + 5],
      due = math.max(tonumber(args[base + 1]), now), budget = tonumber(args[base + 2]),
      payload = args[base + 3], unique_ms = tonumber(args[base + 6]),
      group = args[base + 7] ~= '' and args[base + 7] or nil, row = rows[i + 1]})
    table.insert(keyed_at, i + 1)
  else
    taken[id] = true
    local due = math.max(tonumber(args[base + 1]), now)
    local pair = 2 * written
    scored[pair + 1], scored[pair + 2] = int(due), id
    stored_payloads[pair + 1] = id
    stored_payloads[pair + 2] = wrap(tonumber(args[base + 2]), due, args[base + 3])
    written = written + 1
    if args[base + 7] ~= '' then
      table.insert(grouped, id)
      table.insert(grouped, args[base + 7])
    end
    if expiring[i + 1] then
      table.insert(expiry_scored, int(expiring[i + 1]))
      table.insert(expiry_scored, id)
    end
    if earliest == nil or due < earliest then
      earliest = due
    end
    dues[i + 1] = due
  end
end
if #keyed > 0 then
  local outcomes, keyed_earliest, refusal = send_keys(keyed, now)
  if refusal then
    return redis.error_reply(refusal)
  end
  for j, position in ipairs(keyed_at) do
    local code, due = outcomes[3 * j - 1], outcomes[3 * j]
    if code == 1 or code == 3 then
      written = written + 1
    end
    -- Created, or the key's waiting message replaced: written. Kept or held: not.
    dues[position] = (code == 1 or code == 3) and due or -1
    -- Its expiry, or none (a replace without one drops the replaced message's).
    local written_id = outcomes[3 * j - 2]
    if (code == 1 or code == 3) and expiring[position] then
      table.insert(expiry_scored, int(expiring[position]))
      table.insert(expiry_scored, written_id)
    elseif code == 3 and expiry_used() then
      call('ZREM', expiries, written_id)
    end
  end
  if keyed_earliest ~= nil and (earliest == nil or keyed_earliest < earliest) then
    earliest = keyed_earliest
  end
end
call_chunked('ZADD', pending, scored)
call_chunked('HSET', payloads, stored_payloads)
-- (After send_keys: a call's keyed grouped messages are numbered before its unkeyed ones.)
record_groups(grouped)
call_chunked('ZADD', relayed, notes)
call_chunked('ZADD', expiries, expiry_scored)

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
-- The metrics history: the messages written (created or replaced) were sent.
count_minute(now, {SENT, written})
table.insert(dues, warnings)
return dues
