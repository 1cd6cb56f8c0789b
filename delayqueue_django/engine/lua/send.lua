--[[
  send: schedule a batch of new messages (one call per batch of at most SEND_BATCH_SIZE).

  KEYS[1]: the queue's pending key alone; begin() is given the whole layout derived from
        it (layout_of, see _prelude.lua). Writes pending and payload (the budget
        and due time go with the payload: a message has no meta record until it is
        handed out), and the metrics history (its messages sent, one command a call).
  ARGV[1]  wake-up channel
  ARGV[2]  n, the number of messages
  then, five values per message:
    id         message id (must be new to the queue)
    at_ms      absolute due time in ms since the epoch, or "" to use delay_us; a time
               already past is due now (the server's clock)
    delay_us   delay in whole microseconds counted from the Redis server's clock (used
               when at_ms is ""); the due time is rounded up to the ms, so that no fetch
               hands the message out before the delay has passed
    budget     retries allowed after the first delivery
    payload    JSON text
  then m, the number of grouped messages among them (left out: 0; a single plain send
  leaves it out), and m pairs: index (1-based, in the batch), group (see "Ordered groups"
  in the prelude; written only for a new message)
  then, optionally, the batch's expiries: a count e, and e triples: the message's place in
  the batch (from 1), at_ms (or "") and in_us, read as a due time is (see read_expiries in
  the prelude); kept in <tag>:expires

  Returns {due_ms..., warnings}: the due time given to each message, in order.
  Errors (nothing written): "DUPLICATE <id>" if an id is already known to the queue with
  another payload; "EXPIRES_BEFORE_DUE <id>" if a message's expiry is not after its due
  time (it could never be handed out). Known means stored: every step that deletes a
  payload deletes its meta record in the same call, so a meta record without a payload is
  damage (check_invariants names it "orphan-meta"), and is not looked for: a message sent
  under its id is new, and its first delivery takes that record over (lease, attempt,
  budget), as fetch reads a message's meta record before its payload.
  A message whose id is already stored with this very payload is a replay of a send whose
  reply was lost (clients re-send after a timeout or a cut connection): it is left as it
  is, and its due time is its pending score if it is still pending, else the time it last
  became due (it is staged, in flight or dead), else now (its meta record is unreadable).
  An id no longer stored (its message was handled, or deleted) is new to the queue: a
  replay arriving after that schedules the message again.
  Publishes the earliest due time when it is earlier than every pending message's.
]]

local channel, n = args[1], tonumber(args[2])
local now = now_ms()

local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = args[3 + i * 5]
end
-- (The groups' count and pairs come first, then the expiries: see the header.)
local grouped = tonumber(args[3 + n * 5]) or 0
local expiring = read_expiries(args, 4 + n * 5 + grouped * 2, now)

-- A new message's due time (the i-th of the batch, from 0).
local function due_of(i)
  local base = 3 + i * 5
  if args[base + 1] ~= '' then
    -- A time already past is due now: kept as it was, it would read as a lag of its age
    -- in stats and as lateness in the workers' figures.
    return math.max(tonumber(args[base + 1]), now)
  end
  return due_after(now, delay_of(args[base + 2]))
end

-- A batch of one (each plain send()) checks and writes its payload in one HSETNX, which
-- writes nothing where the id is stored: then it is read and judged below as in a batch.
-- (Not when its expiry refuses it: a refused batch must leave no trace.)
local claimed, first_due = false, nil
if n == 1 then
  first_due = due_of(0)
  if not (expiring[1] and expiring[1] <= first_due) then
    claimed = call('HSETNX', payloads, ids[1], wrap(tonumber(args[6]), first_due, args[7])) == 1
  end
end

-- A claimed plain message (a batch of one, no group, no expiry: every plain send()) is new:
-- the steps below would find no replay, read nothing more and write only its pending
-- entry. It goes straight there, in the same commands and order (the head, then ZADD),
-- as the general way's loops, empty reads and table building cost Redis more time than
-- the message's own commands.
if claimed and grouped == 0 and not expiring[1] then
  local previous_head = head_score(pending)
  call('ZADD', pending, int(first_due), ids[1])
  if previous_head == nil or first_due < previous_head then
    wake(channel, first_due)
  end
  count_minute(now, {SENT, 1})
  return {first_due, warnings}
end

-- Check the whole batch before writing anything, so a refused batch leaves no trace.
-- The first message found stored with another payload refuses the batch.
local stored = {false}
if not claimed then
  stored = gather('HMGET', payloads, ids)
end
local replayed, stored_due = {}, {}
for i = 0, n - 1 do
  local _, due, payload = unwrap(stored[i + 1] or '')
  if stored[i + 1] and payload == args[7 + i * 5] then
    replayed[i], stored_due[i + 1] = true, due
  elseif stored[i + 1] then
    return redis.error_reply('DUPLICATE ' .. ids[i + 1])
  end
end

-- A replay's due time is its pending score if it is still pending, else the due time its
-- meta record keeps, else the one kept with its payload, else now. Read before the writes
-- below, which cannot touch it: an id the batch writes was unknown to the queue, while a
-- replayed one is stored. (Only replays read these: a new message's send reads nothing
-- more.)
local replays, replay_dues = {}, {}
for i = 0, n - 1 do
  if replayed[i] then
    table.insert(replays, ids[i + 1])
    replay_dues[#replays] = stored_due[i + 1]
  end
end
local replay_scores = gather('ZMSCORE', pending, replays)
local replay_records = gather('HMGET', metas, replays)

-- Then every new message is written with one ZADD and one HSET. An id given twice in
-- the batch (Queue never does: it makes the ids) is written twice and the later entry
-- wins, as with one call per message; the reply still has a due time for each entry, and
-- the earlier entry's due time still counts for the wake-up.
local previous_head = head_score(pending)
local earliest = nil
local dues, scored, stored_payloads, expiry_scored = {}, {}, {}, {}
local replay, written = 0, 0
for i = 0, n - 1 do
  local base = 3 + i * 5
  local id, budget = ids[i + 1], tonumber(args[base + 3])
  local due
  if replayed[i] then
    replay = replay + 1
    due = tonumber(replay_scores[replay])
    if not due then
      local _, _, _, became_due = parse_meta(replay_records[replay])
      became_due = became_due or replay_dues[replay] or 0
      due = became_due > 0 and became_due or now
    end
  else
    due = due_of(i)
    local expiry = expiring[i + 1]
    if expiry then
      if expiry <= due then
        return redis.error_reply('EXPIRES_BEFORE_DUE ' .. id)
      end
      table.insert(expiry_scored, int(expiry))
      table.insert(expiry_scored, id)
    end
    -- Appended by index, which costs Lua a fraction of table.insert's call. (A claimed
    -- message's payload is written already.)
    local pair = 2 * written
    scored[pair + 1], scored[pair + 2] = int(due), id
    if not claimed then
      stored_payloads[pair + 1], stored_payloads[pair + 2] = id, wrap(budget, due, args[base + 4])
    end
    written = written + 1
    if earliest == nil or due < earliest then
      earliest = due
    end
  end
  dues[i + 1] = due
end
call_chunked('ZADD', pending, scored)
call_chunked('HSET', payloads, stored_payloads)
call_chunked('ZADD', expiries, expiry_scored)

-- Ordered groups: each new grouped message numbered in send order (see the prelude).
if grouped > 0 then
  local entries = {}
  for j = 0, grouped - 1 do
    local index = tonumber(args[4 + n * 5 + j * 2])
    if not replayed[index - 1] then
      table.insert(entries, ids[index])
      table.insert(entries, args[5 + n * 5 + j * 2])
    end
  end
  record_groups(entries)
end

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
-- The metrics history counts the batch's new messages (a replay was counted before) in
-- one command, whatever the batch's size.
count_minute(now, {SENT, written})
table.insert(dues, warnings)
return dues
