--[[
  Shared prelude of every script of this folder. engine/scripts.py builds one Redis
  Functions library from it: this prelude, run once when the library is loaded, then each
  script's file as the body of a function taking (keys, args), the KEYS and ARGV its
  header lists. (Where a server refuses FUNCTION LOAD, the same text is sent as one
  EVALSHA script per function: this prelude and the function, called at once.)

  Every script receives the same keys, all sharing the queue's hash tag so that a
  script touches a single Redis Cluster slot (send receives KEYS[1] alone, and begin()
  is given the rest derived from it by layout_of: a send per message carries one key, not
  ten; see FIRST_KEY_ONLY in engine/scripts.py):
    KEYS[1] pending    zset  id -> due time (ms, server clock)
    KEYS[2] ready      list  ids due for their first delivery (bounded staging list)
    KEYS[3] unack      zset  id -> redelivery deadline (ms)
    KEYS[4] retry      list  ids due for redelivery (bounded staging list)
    KEYS[5] garbage    zset  id -> time its retries ran out (ms)
    KEYS[6] payload    hash  id -> JSON payload, after its budget and due time (see wrap)
    KEYS[7] meta       hash  id -> "lease:attempt:budget:due", from the message's first
                             delivery on (or a retry, deliver-now): a message never handed
                             out has none; its lease and attempt are 0, and its budget
                             and due time are kept with its payload
    KEYS[8] exhausted  zset  id -> earliest time its exhaustion may be announced (ms)
    KEYS[9] quarantine zset  the keys that held a structure of the wrong type, each renamed
                             aside to "<KEYS[9]>:<part>:<ms>" (":<n>" added if taken), so it
                             stays in the queue's slot: its name -> when (ms). (A version
                             before this index renamed one such key to KEYS[9] itself.)
    KEYS[10] throughput hash "<minute>:acked" / "<minute>:failed" -> count, minute being
                             the Redis clock's ms // 60000 (pruned by prune_throughput);
                             and running totals since the queue began, never pruned:
                             "all:acked", "all:failed" (refusals and timeouts),
                             "all:retried" (deliveries scheduled again), "all:timed_out",
                             "all:exhausted" (buried with retries used up or refused),
                             "all:superseded" (keyed messages removed on their way back
                             to waiting, see "Keys" below),
                             "all:expired" (buried as their expiry passed) and
                             "all:postponed" (deliveries a handler postponed), see
                             "Expiry and postpones" below

  Keys: the keys of keyed messages (the user's own names for them, see send_keyed.lua)
  are not in KEYS: begin() derives their names from the payload key's, "<tag>:payload", so
  they share its hash tag (the same Cluster slot) and no script's KEYS list changes:
    <tag>:keys        hash   key -> id of the key's message: the latest created with it,
                             or the one that took it back (see settle_keys); the field ""
                             (never a key) marks that the queue has had a keyed message,
                             so one EXISTS tells a queue that never used keys, which pays
                             nothing more
    <tag>:hold:<key>  string id of the message whose send holds the key (unique_for),
                             set with PX: Redis reclaims it when it expires
    <tag>:key_rows    hash   key -> the outbox rows that wrote the key's message (see
                             "Outbox rows" below): "<id bytes>:<id>", the message,
                             then per outbox database "<name bytes>:<name><row id>;", the
                             newest of its rows whose replace created or replaced it. An
                             entry naming another message than the key's is stale, read as
                             none; dropped with the key's index entry. Only on a queue whose
                             relays brought keyed replace rows
  A keyed message's stored body starts with "~<key bytes>~<generation>~<key>" (see
  split_key and engine/keyed.py).

  Flow gates (pause, RATE_LIMIT, MAX_IN_FLIGHT; see "Flow gates" at the end): two more
  keys begin() derives the same way, both absent on a queue that never used them:
    <tag>:flow        hash   "paused" -> "1" while the queue is paused; "rate" ->
                             "<count>:<period ms>", a rate limit set at run time that
                             overrides the setting's (on shard 0 only, of a sharded queue);
                             "queue_rate" -> the whole queue's, as set (on every shard: it
                             tells a fetch of any shard that the queue has one). A sharded
                             queue's other shards hold a copy of shard 0's "paused" and
                             "queue_rate" (flow.lua's "copy", see engine/shard_flow.py)
    <tag>:flow:log    zset   "<lease>:<id>" (a fetch of one shard) or "<name>:<n>" (the
                             n-th hand-out reserved by a sharded fetch, see
                             flow_reserve.lua) -> when it was handed out (ms), for the rate
                             limit's sliding window; trimmed by every fetch or reservation
                             of a rate-limited queue, expiring a period after its last write
    <tag>:flow:slots  zset   a sharded queue's MAX_IN_FLIGHT, on shard 0: the id of each
                             delivery in flight on any shard, or "<name>:<n>" for a slot
                             reserved and not yet settled -> its lease deadline (ms, shard
                             0's clock); those past it free their slot
  Expiry and postpones (see "Expiry and postpones" below), derived the same way and only
  touched where they exist, so a queue that never used them pays nothing per message:
    <tag>:expires     zset   id -> its expiry (ms): it is never handed out from then on
    <tag>:postpones   hash   id -> how often a handler postponed it (Postpone)
    <tag>:dead_reason hash   id -> why a dead letter died, when it is not the default
                             (retries used up, or a Reject): "expired", "postponed too often"
  Attempt records (see "Attempt records" below), derived the same way:
    <tag>:history     hash   id -> the message's attempt records, a JSON array of at most
                             HISTORY_ATTEMPTS records, oldest first; only messages with a
                             refused delivery have one, and it goes when they go

  meta fields: lease   the delivery token, bumped on every state change of a delivery,
                       so a late ack or nack from an older delivery never matches;
               attempt deliveries counted against the budget (1 on first delivery);
               budget  retries allowed after the first delivery;
               due     when the message last became due (ms): its send or retry time,
                       the moment it was requeued or promoted, or the deadline of a
                       delivery that timed out. Handed out with each delivery so that
                       workers can measure how late it started.
]]

-- The state of one call, set by begin() as each function starts: the library is loaded
-- once and its functions serve every queue, so nothing here may outlive a call.
local pending, ready, unack, retry, garbage, payloads, metas, exhausted, quarantine, throughput
-- Problems met on the way ({id-or-key, reason} pairs); every script returns them
-- last so the client can log them. Damage never stops the queue.
local warnings
-- The microseconds past the millisecond of the last now_ms() reading: fetch hands them
-- out, so that workers can time their wake-ups to the due time, not up to 1 ms after it.
local now_us
-- The key index, the start of the holds' names and the outbox rows remembered per key (see
-- "Keys" above); whether the latter exists, nil until asked in this call.
local key_index, hold_prefix, key_rows, key_rows_present
-- The flow gates' state and hand-out log (see "Flow gates" at the end).
local flow_state, flow_log, flow_slots
-- Whether one EXISTS found none of the flow options' keys in this call (see
-- options_unused); nil until asked.
local options_absent
-- Expiry and postpones (see "Expiry and postpones" above).
local expiries, postpone_counts, dead_reasons
-- Attempt records (see "Attempt records" above).
local histories

-- The ordered groups' keys and the queue's wake-up channel (see "Ordered groups"), named
-- by begin() like the others; group_names() hands them out.
local group_of_key, group_busy_key, group_prefix, group_channel

-- The names derived from a queue's tag ("<tag>:"), kept for the calls after by the key
-- they come from: the payload key for begin()'s (`kept_names[NAMES]`), the pending key for
-- layout_of's (`kept_names[LAYOUTS]`). A call building them anew (ten to twenty string
-- joins, each hashed and interned by Lua) spent on that about as much of Redis's time as a
-- plain send spends on its own Lua. A name depends on its key alone, so a kept one is
-- never stale (no state of a call's, unlike the variables above); the tables are emptied
-- when they hold KEPT_ENTRIES entries (a queue's names, or its layout), so that a Redis
-- serving many queues keeps a bounded few. (Run as EVALSHA scripts, the prelude runs on
-- every call: the tables then live for one call, which builds its names once, as before.)
local KEPT_ENTRIES = 1000
local NAMES, LAYOUTS = 1, 2
local kept_names, kept_count = {{}, {}}, 0

local function remember(kind, key, names)
  if kept_count >= KEPT_ENTRIES then
    kept_names, kept_count = {{}, {}}, 0
  end
  kept_names[kind][key], kept_count = names, kept_count + 1
  return names
end

-- {keys, holds' prefix, key rows, flow, flow log, flow slots, expiries, postpones, dead
-- reasons, group_of, group_busy, group prefix, wake-up channel, attempt records} from
-- "<tag>:payload".
local function names_of(payload_key)
  local tag = string.sub(payload_key, 1, -8)
  return remember(NAMES, payload_key, {
    tag .. 'keys', tag .. 'hold:', tag .. 'key_rows',
    tag .. 'flow', tag .. 'flow:log', tag .. 'flow:slots',
    tag .. 'expires', tag .. 'postpones', tag .. 'dead_reason',
    tag .. 'group_of', tag .. 'group_busy', tag .. 'group:', tag .. 'wakeup',
    tag .. 'history',
  })
end

local function begin(keys)
  pending, ready, unack, retry = keys[1], keys[2], keys[3], keys[4]
  garbage, payloads, metas, exhausted = keys[5], keys[6], keys[7], keys[8]
  quarantine, throughput = keys[9], keys[10]
  warnings, now_us = {}, 0
  local names = kept_names[NAMES][payloads] or names_of(payloads)
  key_index, hold_prefix, key_rows = names[1], names[2], names[3]
  key_rows_present = nil
  flow_state, flow_log, flow_slots = names[4], names[5], names[6]
  expiries, postpone_counts, dead_reasons = names[7], names[8], names[9]
  group_of_key, group_busy_key, group_prefix, group_channel =
    names[10], names[11], names[12], names[13]
  histories = names[14]
  options_absent = nil
end

-- The whole of KEYS (see the header) from KEYS[1], "<tag>:pending", for the functions
-- given that key alone (engine/scripts.py, FIRST_KEY_ONLY): no Redis command, ten names,
-- kept by that key like the names above (begin() only reads the table).
local LAYOUT_PARTS = {
  'pending', 'ready', 'unack', 'retry', 'garbage',
  'payload', 'meta', 'exhausted', 'quarantine', 'throughput',
}
local function layout_of(first)
  local layout = kept_names[LAYOUTS][first]
  if layout then
    return layout
  end
  local tag = string.sub(first, 1, -8)
  local keys = {}
  for i = 1, #LAYOUT_PARTS do
    keys[i] = tag .. LAYOUT_PARTS[i]
  end
  return remember(LAYOUTS, first, keys)
end

-- The keys' types, in a fixed order, so that the outcome never depends on table
-- iteration order.
local function expected_types()
  return {
    {pending, 'zset'}, {ready, 'list'}, {unack, 'zset'}, {retry, 'list'},
    {garbage, 'zset'}, {payloads, 'hash'}, {metas, 'hash'}, {exhausted, 'zset'},
    {throughput, 'hash'},
  }
end

-- Scores and other numbers go to Redis through "%d": Lua's default conversion keeps
-- only 14 significant digits, which would round far-future times.
local function int(n)
  return string.format('%d', n)
end

-- When a delay of `delay_ms` ms and `delay_us` µs (0-999) from the last now_ms() reading
-- runs out, in whole ms: rounded up, because a fetch hands out what is due by its clock
-- truncated to the ms, and nothing may be handed out before its time. No delay at all is
-- due at `now` itself: every later call runs after this one.
local function due_after(now, delay_ms, delay_us)
  if delay_ms == 0 and delay_us == 0 then
    return now
  end
  return now + delay_ms + math.ceil((now_us + delay_us) / 1000)
end

-- A delay given as whole µs, cut apart as text into ms and the µs left over, so that it
-- stays exact at any size (a double holds every whole µs only up to 2^53, 285 years).
local function delay_of(text)
  return tonumber(string.sub(text, 1, -4)) or 0, tonumber(string.sub(text, -3))
end

-- The Redis clock in ms; now_ms() also keeps the µs past that ms (see now_us).
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end

local function now_ms()
  local now
  now, now_us = clock()
  return now
end

-- Renames a key aside to a name of its own under the quarantine key's (see KEYS[9]), never
-- over another, and indexes it there; returns the name.
local function rename_aside(key, now)
  local base = quarantine .. ':' .. string.match(key, '[^:]*$') .. ':' .. int(now)
  local name, taken = base, 1
  while redis.call('EXISTS', name) == 1 do
    taken = taken + 1
    name = base .. ':' .. taken
  end
  redis.call('RENAME', key, name)
  redis.call('ZADD', quarantine, int(now), name)
  return name
end

-- A key holding the wrong type fails every command on it (WRONGTYPE), which would stop the
-- queue: the functions that write rename it aside and carry on with an empty one. They
-- do so when a command first meets it (see call), which checks nothing while the keys
-- are sound: a call checking every key's TYPE first spent more time on that than on its
-- own work.
local function rename_foreign(key)
  local now = clock()
  local index = redis.call('TYPE', quarantine)['ok']
  if index ~= 'none' and index ~= 'zset' then
    -- A key an older version renamed to the quarantine key itself: kept the same way.
    table.insert(warnings, {quarantine, 'held a key set aside by an older version; ' ..
      'renamed to ' .. rename_aside(quarantine, now)})
  end
  local expected = 'another type'
  for _, entry in ipairs(expected_types()) do
    if entry[1] == key then
      expected = 'a ' .. entry[2]
    end
  end
  local actual = redis.call('TYPE', key)['ok']
  table.insert(warnings, {key, 'held a ' .. actual .. ' instead of ' .. expected ..
    '; renamed to ' .. rename_aside(key, now)})
end

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local function wrong_type(reply)
  return string.sub(reply.err, 1, 9) == 'WRONGTYPE'
end

-- redis.call for a command on one of the queue's keys. A key of the wrong type fails the
-- first command on it in this call (none before touched it): renamed aside, the key is
-- empty and the command runs again. So the call ends as if the key had been empty from its
-- start, as when every key's TYPE was checked first: never stopped halfway.
local function call(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if failed(reply) then
    if not wrong_type(reply) then
      error(reply)
    end
    rename_foreign(key)
    return redis.call(command, key, ...)
  end
  return reply
end

-- Read-only scripts do not move anything: they report the key and treat it as empty.
local function foreign_keys()
  local foreign = {}
  for _, entry in ipairs(expected_types()) do
    local key, expected = entry[1], entry[2]
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= expected then
      foreign[key] = true
      table.insert(warnings, {key, 'holds a ' .. actual .. ' instead of a ' .. expected})
    end
  end
  return foreign
end

-- Lua numbers are doubles, exact up to 2^53: a larger field would be rounded, and "%d"
-- writes one past 2^63 back as a negative number. Such a record is damage.
local LARGEST_META_NUMBER = 9007199254740991

-- Parses a meta record as HGET or HMGET return it (false when the field is missing).
-- Returns lease, attempt, budget, due as numbers, or nil when the record is missing or
-- damaged. A record written before due was kept has three fields; its due reads as 0.
local function parse_meta(raw)
  if not raw then
    return nil
  end
  local lease, attempt, budget, due = string.match(raw, '^(%d+):(%d+):(%d+):(%d+)$')
  if not lease then
    lease, attempt, budget = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if not lease then
      return nil
    end
    due = 0
  end
  lease, attempt, budget = tonumber(lease), tonumber(attempt), tonumber(budget)
  due = tonumber(due)
  local largest = LARGEST_META_NUMBER
  if lease > largest or attempt > largest or budget > largest or due > largest then
    return nil
  end
  return lease, attempt, budget, due
end

local function read_meta(id)
  return parse_meta(call('HGET', metas, id))
end

-- Whether a delivery's token still holds: it must equal the lease of a readable meta
-- record (a missing or damaged record reads as nil, as does a token that is no number).
local function holds(lease, token)
  return lease ~= nil and lease == token
end

-- A meta record's text (see the fields above), every field through "%d" like int(); in
-- one string.format call, which costs Lua less than four joined ones.
local function format_meta(lease, attempt, budget, due)
  return string.format('%d:%d:%d:%d', lease, attempt, budget, due)
end

-- A message never handed out has no meta record (about 96 bytes of Redis memory each): its
-- retry budget and the time it was due when sent are kept at the start of its stored
-- payload, as "~<budget>~<due>~", which JSON text never starts with. (Not only the budget:
-- a message staged in ready would then need a record for its due time, written at
-- staging, and in a burst the small meta hash, a listpack, makes every such write slow.)
-- Once a meta record is written (a delivery, a retry, deliver-now), it is the one to read.
local function wrap(budget, due, payload)
  return string.format('~%d~%d~', budget, due) .. payload
end

-- The budget, due time and payload in a stored payload. A payload a previous release stored
-- carries neither (its message has a meta record): nil, nil and the payload as it is.
local function unwrap(stored)
  local budget, due = string.match(stored, '^~(%d+)~(%d+)~')
  if not budget then
    return nil, nil, stored
  end
  return tonumber(budget), tonumber(due), string.sub(stored, #budget + #due + 4)
end

-- The first `limit` bytes at most of `text`, cut on a UTF-8 character boundary so that a
-- cut never splits a character (list's previews, peek's limit): bytes that are not UTF-8
-- are cut as they come. Cutting here, in Redis, keeps the rest of a large payload off the
-- wire.
local function utf8_prefix(text, limit)
  if string.len(text) <= limit then
    return text
  end
  local cut = limit
  -- Step back over continuation bytes (10xxxxxx) to the lead byte of the last character.
  local lead = cut
  while lead > 0 and lead > cut - 3 do
    local byte = string.byte(text, lead)
    if byte < 0x80 or byte >= 0xC0 then
      break
    end
    lead = lead - 1
  end
  if lead > 0 then
    local byte = string.byte(text, lead)
    local width = 1
    if byte >= 0xF0 then width = 4 elseif byte >= 0xE0 then width = 3 elseif byte >= 0xC0 then width = 2 end
    if lead + width - 1 > cut then
      cut = lead - 1
    end
  end
  return string.sub(text, 1, cut)
end

-- The meta record of a message never handed out, made from its stored payload (false when
-- it is missing); nil when the payload carries no budget.
local function first_meta(stored)
  if not stored then
    return nil
  end
  local budget, due = unwrap(stored)
  if budget == nil or budget > LARGEST_META_NUMBER or due > LARGEST_META_NUMBER then
    return nil
  end
  return format_meta(0, 0, budget, due)
end

-- What parse_meta reads in the record first_meta makes from a stored payload, and the
-- payload's body, without writing that record out and parsing it back: fetch hands out
-- every first delivery this way. nil when the payload carries no readable budget.
local function first_fields(stored)
  local budget, due, body = unwrap(stored)
  if budget == nil or budget > LARGEST_META_NUMBER or due > LARGEST_META_NUMBER then
    return nil
  end
  return 0, 0, budget, due, body
end

local function write_meta(id, lease, attempt, budget, due)
  call('HSET', metas, id, format_meta(lease, attempt, budget, due))
end

-- Batches. The hot scripts (send, fetch, ack, nack) read and write a whole batch with one
-- multi-member command per step instead of a few commands per message: each redis.call
-- has a fixed cost that dominated the server's time per message.
-- Lua 5.1's unpack() fails ("too many results to unpack") past about 8,000 values, while
-- a batch may name MAX_BATCH_SIZE (10,000) messages, 20,000 values for a ZADD or HSET;
-- so a command over a list is issued in chunks of at most CHUNK values. CHUNK is even, so
-- that a score/member or field/value pair never straddles two calls.
local CHUNK = 1000

-- Issues `command key values...` over the list in chunks (ZADD, HSET, ZREM, HDEL, RPUSH).
-- An empty list issues nothing (those commands refuse to run without members).
local function call_chunked(command, key, values)
  local total = #values
  for first = 1, total, CHUNK do
    call(command, key, unpack(values, first, math.min(first + CHUNK - 1, total)))
  end
end

-- The same for a read that answers one value per member (HMGET, ZMSCORE): returns the
-- answers joined in the order of `values`; a missing field or member reads as false.
local function gather(command, key, values)
  local answers, total, count = {}, #values, 0
  for first = 1, total, CHUNK do
    local last = math.min(first + CHUNK - 1, total)
    local part = call(command, key, unpack(values, first, last))
    for i = 1, #part do
      count = count + 1
      answers[count] = part[i]
    end
  end
  return answers
end

-- {score, id, score, id, ...}: every id at the same score, for ZADD.
local function at_score(score, ids)
  local scored = {}
  for i, id in ipairs(ids) do
    scored[2 * i - 1] = score
    scored[2 * i] = id
  end
  return scored
end

-- Adds n to a count in the throughput hash. A field holding no integer (a foreign write)
-- would fail HINCRBY halfway through a script, after some of its moves: the count starts
-- again at n instead, and the warning says so.
local function add_count(field, n)
  local added = redis.pcall('HINCRBY', throughput, field, n)
  if failed(added) and wrong_type(added) then
    rename_foreign(throughput)
    added = redis.pcall('HINCRBY', throughput, field, n)
  end
  if failed(added) then
    redis.call('HSET', throughput, field, int(n))
    table.insert(warnings, {throughput, 'field ' .. field .. ' could not count (' ..
      added.err .. '); it starts again at ' .. int(n)})
  end
end

-- Running totals for monitoring: counted here, in the step that makes them true, they add
-- up across any number of workers and survive a worker's crash.
local function count_total(what, n)
  if n > 0 then
    add_count('all:' .. what, n)
  end
end

-- Retries used up: park the messages as dead letters and record that their exhaustion
-- still has to be announced, so a worker dying right after this cannot lose the news.
local function bury(ids, now)
  local scored = at_score(int(now), ids)
  call_chunked('ZADD', garbage, scored)
  call_chunked('ZADD', exhausted, scored)
  count_total('exhausted', #ids)
end

-- A message whose payload or meta record is missing or unreadable cannot be delivered:
-- it goes to garbage (not announced as exhausted: it never ran), and the warning says
-- why. Noted in `aside` on the way; set_aside then parks a step's noted ids at once.
local function note_damage(aside, id, reason)
  table.insert(aside, id)
  table.insert(warnings, {id, reason})
end

local function set_aside(aside, now)
  call_chunked('ZADD', garbage, at_score(int(now), aside))
end

-- Expiry and postpones (see the header). A message with an expiry is never handed out
-- at or after it: fetch dead-letters it as it stages or takes it, and a retry or postpone
-- due at or after it dead-letters it at once. Such dead letters, and a message postponed
-- more often than its queue allows, keep their reason in dead_reasons and are announced
-- like exhausted ones (the exhausted zset), the reason telling which signal to send.

-- The expiries a send's ARGV carries after its messages, from index `at` on: a count m,
-- then m triples (the message's place in the batch, from 1; at_ms or ""; in_us). Returns
-- place -> expiry (ms): an at_ms as given, an in_us from the clock rounded up like a delay.
local function read_expiries(args, at, now)
  local by_place = {}
  for i = 1, tonumber(args[at] or '0') or 0 do
    local base = at + (i - 1) * 3
    if args[base + 2] ~= '' then
      by_place[tonumber(args[base + 1])] = tonumber(args[base + 2])
    else
      by_place[tonumber(args[base + 1])] = due_after(now, delay_of(args[base + 3]))
    end
  end
  return by_place
end

-- Whether the queue ever had a message with an expiry: the one read a queue without pays.
local function expiry_used()
  return redis.call('EXISTS', expiries) == 1
end

-- The ids whose expiry is at or before their time in `at` (ms, by position), as a set.
local function expired_among(ids, at)
  local scores, gone = gather('ZMSCORE', expiries, ids), {}
  for i, id in ipairs(ids) do
    if scores[i] and tonumber(scores[i]) <= at[i] then
      gone[id] = true
    end
  end
  return gone
end

-- Defined with the ordered groups below: a dead letter passes its group on.
local release_groups

-- Dead letters with a reason of their own, announced like exhausted ones; `total` names
-- the running total they count in. A dead letter forgets its expiry: it no longer waits,
-- and passes its ordered group on (as any burial does). Returns the earliest due time of
-- the groups' next messages, back in pending (nil when none passed on).
local function bury_for(ids, now, reason, total)
  if #ids == 0 then
    return nil
  end
  local scored, reasons = at_score(int(now), ids), {}
  for i, id in ipairs(ids) do
    reasons[2 * i - 1], reasons[2 * i] = id, reason
  end
  call_chunked('ZADD', garbage, scored)
  call_chunked('ZADD', exhausted, scored)
  call_chunked('HSET', dead_reasons, reasons)
  call_chunked('ZREM', expiries, ids)
  count_total(total, #ids)
  return release_groups(ids, false)
end

-- Messages leaving the queue, or starting a new life (requeue): their expiry, postpone
-- count, dead reason and attempt records go with them. One EXISTS on a queue that never
-- had any.
local function forget_flow(ids)
  if #ids > 0 and
      redis.call('EXISTS', expiries, postpone_counts, dead_reasons, histories) > 0 then
    call_chunked('ZREM', expiries, ids)
    call_chunked('HDEL', postpone_counts, ids)
    call_chunked('HDEL', dead_reasons, ids)
    call_chunked('HDEL', histories, ids)
  end
end

-- Attempt records. Every refusal of a delivery (nack.lua: an error, a False, Retry,
-- Reject, Postpone, the time limit, a burial as expired or postponed too often) and every
-- lease that ran out (fetch.lua) writes a record of that attempt in the call that writes
-- its verdict, so neither is ever stored without the other. A record is a JSON array
--   [attempt, verdict, error class, error, traceback, worker, started ms, ended ms, cut]
-- (started null when not known; cut "e" and/or "t" when the worker cut the error's text
-- or its traceback to their bounds), and a message keeps at most `bound` of them
-- (HISTORY_ATTEMPTS), the newest, in one field of <tag>:history as a JSON array. A value
-- that is not such an array (a foreign write) is replaced. An ack leaves the records
-- alone unless they may exist (ack.lua: an attempt past the first, or a tracked
-- delivery), so a message that never failed pays nothing for them.
-- `entries`: {id, record} pairs, the record a Lua array as above.
local function record_attempts(entries, bound)
  if bound <= 0 or #entries == 0 then
    return
  end
  local ids = {}
  for i, entry in ipairs(entries) do
    ids[i] = entry[1]
  end
  local raw, kept, written = gather('HMGET', histories, ids), {}, {}
  for i, entry in ipairs(entries) do
    local id = entry[1]
    local records = kept[id]
    if not records then
      local ok, decoded = false, nil
      if raw[i] then
        ok, decoded = pcall(cjson.decode, raw[i])
      end
      records = {}
      if ok and type(decoded) == 'table' then
        for j = 1, #decoded do
          records[j] = decoded[j]
        end
      end
      kept[id] = records
      table.insert(written, id)
    end
    table.insert(records, entry[2])
    while #records > bound do
      table.remove(records, 1)
    end
  end
  local values = {}
  for _, id in ipairs(written) do
    table.insert(values, id)
    table.insert(values, cjson.encode(kept[id]))
  end
  call_chunked('HSET', histories, values)
end

-- (The payload first: a message never handed out keeps its first record there.)
local function damage_of(id, has_payload, lease)
  if not has_payload then
    return 'payload missing; moved to garbage'
  end
  if not lease then
    return 'meta record missing or unreadable; moved to garbage'
  end
  return nil
end

-- Lost replies of ack and nack. Redis can run a verdict and the reply still be lost (a
-- connection cut, a client timing out while Redis was stalled); the caller then repeats
-- the call, and a second run would find nothing left to do and answer as if the verdict
-- had come too late. So a caller may name its request (KEYS[11], its own record key, and
-- a request id): the script keeps its reply there, a string holding the request id and
-- the reply packed with cmsgpack, expiring after record_ms; a repeat of that request is
-- answered from the record, changing nothing. A new request replaces the record, but
-- only when it changed something: a request that changed nothing (every lease stale)
-- gives the same reply when run again, and a script that writes nothing stays runnable
-- on a Redis out of memory (which refuses a script's first write of new data).
-- A msgpack string carries its length, so a request's packed id is never the start of
-- another's: comparing the record's start with it is exact. A record key holding another
-- type (written by anyone but this queue) holds no record: the next one replaces it.
local function recorded_reply(record_key, request)
  if request == '' then
    return nil
  end
  local raw = redis.pcall('GET', record_key)
  local tag = cmsgpack.pack(request)
  if type(raw) ~= 'string' or string.sub(raw, 1, #tag) ~= tag then
    return nil
  end
  local _, reply = cmsgpack.unpack(raw)
  return reply
end

local function record_reply(record_key, request, reply, count, record_ms)
  if request ~= '' and count > 0 then
    redis.call('SET', record_key, cmsgpack.pack(request, reply), 'PX', record_ms)
  end
end

-- record_reply and recorded_reply in one command, for a request known to change something
-- (a reply with a count above 0): records its reply with SET ... GET, which answers the
-- record it replaced. When that was this very request's (a repeat whose first run's reply
-- was lost), it is put back and its reply returned: the caller then writes nothing else.
-- Else nil, and the new record stands. (Checked before the caller's writes, like
-- recorded_reply: SET is this call's first write.)
local function swap_reply(record_key, request, reply, record_ms)
  if request == '' then
    return nil
  end
  local packed = cmsgpack.pack(request, reply)
  local raw = redis.pcall('SET', record_key, packed, 'PX', record_ms, 'GET')
  if failed(raw) then
    -- The key holds another type: no record; a record replaces it, as record_reply's does.
    redis.call('SET', record_key, packed, 'PX', record_ms)
    return nil
  end
  local tag = cmsgpack.pack(request)
  if type(raw) ~= 'string' or string.sub(raw, 1, #tag) ~= tag then
    return nil
  end
  redis.call('SET', record_key, raw, 'PX', record_ms)
  local _, recorded = cmsgpack.unpack(raw)
  return recorded
end

-- Wakes idle workers when the earliest due time moved earlier (or work is waiting).
local function wake(channel, due)
  redis.call('PUBLISH', channel, int(due))
end

-- Per-minute counts of acked and failed deliveries, and their totals, for monitoring.
local function count_throughput(now, what, n)
  if n > 0 then
    add_count(int(math.floor(now / 60000)) .. ':' .. what, n)
    count_total(what, n)
  end
end

local function head_score(key)
  local head = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end

-- Keys (see "Keys" in the header). A body (a stored payload after unwrap) of a keyed
-- message starts with "~<key bytes>~<generation>~<key>", which JSON text and the trace
-- mark never start with: an unkeyed body costs one byte's test. Returns the key, the
-- generation and the payload after them; nil, 0 and the body when it carries no key (or
-- a prefix that does not add up, a foreign write: the body is then taken as it is).
local function split_key(body)
  if string.byte(body, 1) ~= 126 then -- "~"
    return nil, 0, body
  end
  local size, generation = string.match(body, '^~(%d+)~(%d+)~')
  if not size then
    return nil, 0, body
  end
  local start = #size + #generation + 4
  size = tonumber(size)
  if size < 1 or start + size - 1 > #body then
    return nil, 0, body
  end
  return string.sub(body, start, start + size - 1), tonumber(generation),
    string.sub(body, start + size)
end

local function keyed_body(key, generation, payload)
  return string.format('~%d~%d~', #key, generation) .. key .. payload
end

-- The key a stored payload (as HGET reads it, false when missing) carries, or nil.
local function key_in(stored)
  if not stored then
    return nil
  end
  local _, _, body = unwrap(stored)
  return (split_key(body))
end

-- Whether the queue ever had a keyed message (the key index's marker field keeps it): the
-- one read a queue that never used keys pays on the paths that keep the index.
local function keys_used()
  return redis.call('EXISTS', key_index) == 1
end

-- Whether a message waits (stored, neither in flight nor dead) as this call leaves it:
-- `moved` gives, for the ids the call moved but has not written yet, true if they wait.
local function waits(id, moved)
  local known = moved[id]
  if known ~= nil then
    return known
  end
  return call('HEXISTS', payloads, id) == 1 and not call('ZSCORE', unack, id)
    and not call('ZSCORE', garbage, id)
end

-- Returning to waiting (a retry, a release, a delivery that timed out, a requeue): a keyed
-- message takes its key back unless another message waits as the key's message; then it
-- is superseded, since that newer message carries the key's work. `ids` return in one
-- step, `stored` their payloads in order; `moved` marks the other ids the step moves
-- (see waits). The key's own message among them is settled first, so that an older one
-- returning beside it never wins over it. Marks each id in `moved` and returns the set of
-- those superseded (the caller removes them, or leaves a dead letter dead).
local function settle_keys(ids, stored, moved)
  local others, superseded = {}, {}
  for i, id in ipairs(ids) do
    local key = key_in(stored[i])
    if key then
      if call('HGET', key_index, key) == id then
        moved[id] = true
      else
        table.insert(others, {id, key})
      end
    end
  end
  for _, entry in ipairs(others) do
    local id, key = entry[1], entry[2]
    local holder = call('HGET', key_index, key)
    if holder and waits(holder, moved) then
      superseded[id], moved[id] = true, false
    else
      call('HSET', key_index, key, id)
      moved[id] = true
    end
  end
  return superseded
end

-- Superseded messages leave the queue (payload and meta record), counted as such. One
-- that held its ordered group (it was in flight: only a holder is handed out) passes it
-- on, so that the group's next message, perhaps the newer one of its key, runs.
local function remove_superseded(ids)
  release_groups(ids, true)
  call_chunked('HDEL', payloads, ids)
  call_chunked('HDEL', metas, ids)
  forget_flow(ids)
  count_total('superseded', #ids)
end

-- Messages leaving the queue for good (acked, cancelled, deleted, purged): the key index
-- forgets each that still is its key's message, and the outbox rows remembered for the
-- key go with it (looked for once per call: a queue no relay brought keyed rows to has
-- none). `stored`: their payloads, read before they are deleted.
local function forget_keys(ids, stored)
  for i, id in ipairs(ids) do
    local key = key_in(stored[i])
    if key and call('HGET', key_index, key) == id then
      call('HDEL', key_index, key)
      if key_rows_present == nil then
        key_rows_present = redis.call('EXISTS', key_rows) == 1
      end
      if key_rows_present then
        call('HDEL', key_rows, key)
      end
    end
  end
end

-- Outbox rows (relay.lua's keyed rows, issue #33). Relays take rows concurrently, so one
-- may bring a key's older row after another brought a newer one. A key's rows of one
-- database are decided in the order of their ids all the same: key_rows remembers, for
-- the key's message, the newest row of each database whose replace created or replaced
-- it, and a replace row older than that one writes nothing (its payload was overwritten
-- by a later send's). Rows of different databases have no order between them: each is
-- decided as it comes. A keep never writes on a waiting message; a message a keep created
-- remembers no row, so that a replace row, older or newer, still replaces it (as in row
-- order: a replace, then a keep that keeps it).

-- The message and {database -> row id (digits)} of a key_rows entry (false when none);
-- nil and {} when missing or unreadable (a foreign write: read as none).
local function parse_rows(value)
  if not value then
    return nil, {}
  end
  local size, at = string.match(value, '^(%d+):()')
  if not size then
    return nil, {}
  end
  local id = string.sub(value, at, at + tonumber(size) - 1)
  if #id ~= tonumber(size) then
    return nil, {}
  end
  at = at + #id
  local rows = {}
  while at <= #value do
    local name_size, start = string.match(value, '^(%d+):()', at)
    local row, after
    if name_size then
      row, after = string.match(value, '^(%d+);()', start + tonumber(name_size))
    end
    if not row then
      return nil, {}
    end
    rows[string.sub(value, start, start + tonumber(name_size) - 1)] = row
    at = after
  end
  return id, rows
end

local function format_rows(id, rows)
  local names = {}
  for name in pairs(rows) do
    table.insert(names, name)
  end
  table.sort(names)
  local parts = {#id .. ':' .. id}
  for _, name in ipairs(names) do
    table.insert(parts, #name .. ':' .. name .. rows[name] .. ';')
  end
  return table.concat(parts)
end

-- Whether row id `a` comes before `b` (both digits without leading zeros, as the
-- databases number rows): compared as text, exact however large.
local function row_before(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- Defined with the ordered groups below: a keyed send's messages join (or leave) theirs.
local regroup

-- Keyed sends, decided and written (send_keyed.lua, and relay.lua's keyed rows): `items`,
-- in order, each {id, key, mode, due, budget, payload, unique_ms, group, row} as
-- send_keyed.lua's header describes them (`due` already worked out: ms, not in the past;
-- `group` nil for none; `row`, a relayed row's {database, id}, see "Outbox rows" above, nil
-- for any other send). Each is decided seeing the earlier ones' effect:
--   1. its id is stored with this key: a replay of a send whose reply was lost; nothing
--      written, outcome created (with another key, or none: refused as send refuses it);
--   2. else the key's message waits: keep leaves it; replace gives it this payload, due
--      time and budget, attempt 0 (its meta record, if any, keeps its lease, so a verdict
--      of an older delivery never matches) and a new generation; staged in ready or
--      retry, it goes back to pending; but a replace row older than a row of its database
--      that created or replaced that message leaves it, outcome kept; error refuses the
--      batch;
--   3. else a hold on the key lasts: nothing written, outcome held (error refuses);
--   4. else a new message with the key, which becomes the key's message; with unique_ms a
--      hold on the key starts, until now + unique_ms (only here: a kept, held or replaced
--      send never extends one).
-- A created message joins its item's ordered group, if any, as a new send does; a replaced
-- one leaves the group it had and joins its item's (see regroup), a kept one keeps its own.
-- A message's generation is the server's ms when it was created or last replaced (a
-- replace within the same ms adds 1), stored with its key at the start of its body.
-- Returns {id, code, due_ms, ...} (per item: the id the key names, code 1 created, 2 kept,
-- 3 replaced, 4 held, and that message's due time, -1 when it is not waiting) and the
-- earliest due time written (nil when none); or, refusing the batch with nothing written,
-- nil, nil and the refusal's text ("DUPLICATE <id>", or "DUPLICATE_KEY <n> <held> <id>": item n
-- met the key's waiting message <id> (held 0) or a hold by <id> (held 1) with mode error).
local function send_keys(items, now)
  local ids, message_keys = {}, {}
  for i, item in ipairs(items) do
    ids[i], message_keys[i] = item.id, item.key
  end
  local stored, known = gather('HMGET', payloads, ids), gather('HMGET', metas, ids)
  local pointers = gather('HMGET', key_index, message_keys)

  -- The batch's effect, decided before anything is written so that a refusal leaves no
  -- trace: `fresh` the messages created or replaced (by id; `order` keeps them in order),
  -- and the key index and holds as the batch leaves them.
  local fresh, order, pointer, held_by = {}, {}, {}, {}

  -- The due time of a waiting message as stored: its pending score, else (staged) the due
  -- time its meta record or its payload keeps.
  local function stored_due(id)
    local score = call('ZSCORE', pending, id)
    if score then
      return tonumber(score)
    end
    local _, _, _, due = read_meta(id)
    if due then
      return due
    end
    local _, kept_due = unwrap(call('HGET', payloads, id) or '')
    return kept_due or now
  end

  local function waiting(id)
    return fresh[id] ~= nil or waits(id, {})
  end

  local function due_if_waiting(id)
    if fresh[id] then
      return fresh[id].due
    end
    return waits(id, {}) and stored_due(id) or -1
  end

  -- A stored waiting message about to be replaced: what of it the replace keeps.
  local function load(id)
    local _, _, body = unwrap(call('HGET', payloads, id))
    local _, generation = split_key(body)
    return {generation = generation, lease = read_meta(id),
      staged = not call('ZSCORE', pending, id)}
  end

  local outcomes = {}
  local function answer(id, code, due)
    table.insert(outcomes, id)
    table.insert(outcomes, code)
    table.insert(outcomes, due)
  end

  -- The outbox rows remembered per key (read only for an item that carries its row):
  -- key -> {id, rows} as the batch leaves them, and the keys to write back, in order.
  local remembered, rewritten = {}, {}
  local function rows_of(key)
    local entry = remembered[key]
    if entry == nil then
      local id, rows = parse_rows(call('HGET', key_rows, key))
      entry = {id = id, rows = rows}
      remembered[key] = entry
    end
    return entry
  end
  -- Whether a row of the same database newer than `row` created or replaced `holder`.
  local function overtaken(key, holder, row)
    local entry = rows_of(key)
    local newest = entry.id == holder and entry.rows[row.database]
    return newest and row_before(row.id, newest)
  end
  local function remember(key, id, row)
    local entry = rows_of(key)
    if entry.id ~= id then
      entry.id, entry.rows = id, {}
    end
    entry.rows[row.database] = row.id
    if not entry.rewritten then
      entry.rewritten = true
      table.insert(rewritten, key)
    end
  end

  for i, item in ipairs(items) do
    local id, key, mode = item.id, item.key, item.mode
    local holder = pointer[key]
    if holder == nil then
      holder = pointers[i]
    end
    if fresh[id] and fresh[id].key == key then
      answer(id, 1, fresh[id].due)
    elseif stored[i] and key_in(stored[i]) == key then
      answer(id, 1, due_if_waiting(id))
    elseif stored[i] or known[i] or fresh[id] then
      return nil, nil, 'DUPLICATE ' .. id
    elseif holder and waiting(holder) then
      if mode == 'error' then
        return nil, nil, 'DUPLICATE_KEY ' .. i .. ' 0 ' .. holder
      elseif mode == 'replace' and not (item.row and overtaken(key, holder, item.row)) then
        local entry = fresh[holder]
        if not entry then
          entry = load(holder)
          table.insert(order, holder)
          fresh[holder] = entry
        end
        entry.key, entry.generation = key, math.max(now, entry.generation + 1)
        entry.due, entry.budget, entry.payload = item.due, item.budget, item.payload
        entry.group = item.group
        if item.row then
          remember(key, holder, item.row)
        end
        answer(holder, 3, entry.due)
      else
        answer(holder, 2, due_if_waiting(holder))
      end
    else
      local hold = held_by[key]
      if hold == nil then
        hold = call('GET', hold_prefix .. key)
      end
      if hold then
        if mode == 'error' then
          return nil, nil, 'DUPLICATE_KEY ' .. i .. ' 1 ' .. hold
        end
        answer(hold, 4, due_if_waiting(hold))
      else
        fresh[id] = {key = key, generation = now, due = item.due, budget = item.budget,
          payload = item.payload, created = true, unique_ms = item.unique_ms,
          group = item.group}
        table.insert(order, id)
        pointer[key] = id
        if item.unique_ms > 0 then
          held_by[key] = id
        end
        if item.row and mode == 'replace' then
          remember(key, id, item.row)
        end
        answer(id, 1, fresh[id].due)
      end
    end
  end

  -- Then the writes: each message in one ZADD and one HSET, the key index in one HSET.
  local earliest = nil
  local scored, bodies, records, index = {}, {}, {}, {'', '1'}
  local leaving, joining, renewed = {}, {}, {}
  for _, id in ipairs(order) do
    local entry = fresh[id]
    if not entry.created then
      table.insert(leaving, id)
      -- Replaced after a delivery: its attempts start again, and its records go (see
      -- "Attempt records"; a message never handed out has none).
      if entry.lease then
        table.insert(renewed, id)
      end
    end
    if entry.group then
      table.insert(joining, id)
      table.insert(joining, entry.group)
    end
    if entry.staged and call('LREM', ready, 1, id) == 0 then
      call('LREM', retry, 1, id)
    end
    table.insert(scored, int(entry.due))
    table.insert(scored, id)
    table.insert(bodies, id)
    table.insert(bodies, wrap(entry.budget, entry.due,
      keyed_body(entry.key, entry.generation, entry.payload)))
    if entry.lease then
      table.insert(records, id)
      table.insert(records, format_meta(entry.lease, 0, entry.budget, entry.due))
    end
    if entry.created then
      table.insert(index, entry.key)
      table.insert(index, id)
      if entry.unique_ms > 0 then
        call('SET', hold_prefix .. entry.key, id, 'PX', int(entry.unique_ms))
      end
    end
    if earliest == nil or entry.due < earliest then
      earliest = entry.due
    end
  end
  call_chunked('ZADD', pending, scored)
  call_chunked('HSET', payloads, bodies)
  call_chunked('HSET', metas, records)
  call_chunked('HDEL', histories, renewed)
  if #index > 2 then
    call_chunked('HSET', key_index, index)
  end
  local rows = {}
  for _, key in ipairs(rewritten) do
    table.insert(rows, key)
    table.insert(rows, format_rows(remembered[key].id, remembered[key].rows))
  end
  call_chunked('HSET', key_rows, rows)
  regroup(leaving, joining)
  return outcomes, earliest
end

--[[
  Ordered groups (issue #27). A grouped message's group is not in KEYS either: begin()'s
  tag gives their names, in the queue's slot:
    <tag>:group_of    hash   id -> "<seq>:<group>" for each grouped message stored; seq
                             numbers the queue's grouped sends (the field "", never an id,
                             counts them), so that ties in due time go in send order; one
                             EXISTS tells a queue that never had a grouped message, which
                             pays nothing more
    <tag>:group_busy  hash   group -> id of the message holding it: the one message of the
                             group that may be staged, in flight or waiting for its retry
    <tag>:group:<G>   zset   the group's due messages waiting for it ("parked"): score
                             their due time (ms), member "<seq, 15 digits>:<id>", so that
                             equal due times go in send order
  A parked message stays in pending, scored PARKED + its due time: far beyond any due
  time, so no fetch stages it, while stats, lists, cancel and reschedule still find it
  where a waiting message is. Releasing a group (its holder acked, buried, cancelled,
  deleted) makes its next live parked message the holder, back in pending at its due time.
  A holder that fails keeps the group through its retries and timeouts (as SQS FIFO).
]]

-- Added to a parked message's due time: 2^52, beyond any due time (year 142,000,000), and
-- with a due time added still exact in a double.
local PARKED = 4503599627370496

local function group_names()
  return group_of_key, group_busy_key, group_prefix, group_channel
end

-- Whether the queue ever had a grouped message: the one read an ungrouped queue pays.
local function groups_used()
  local group_of = group_names()
  return redis.call('EXISTS', group_of) == 1
end

-- Whether the queue uses none of the flow options that keep state of their own (a pause
-- or a rate set at run time, expiries, postpone counts, ordered groups): one EXISTS,
-- asked at most once per call, so that a fetch of a queue without any pays that one read
-- instead of one per option.
local function options_unused()
  if options_absent == nil then
    local group_of = group_names()
    options_absent = redis.call('EXISTS', flow_state, expiries, postpone_counts, group_of) == 0
  end
  return options_absent
end

-- New grouped messages (send, relay): {id, group, id, group, ...}, in send order, each
-- numbered after the queue's earlier grouped sends.
local function record_groups(entries)
  local count = #entries / 2
  if count == 0 then
    return
  end
  local group_of = group_names()
  local last = call('HINCRBY', group_of, '', count)
  for k = 1, count do
    entries[2 * k] = int(last - count + k) .. ':' .. entries[2 * k]
  end
  call_chunked('HSET', group_of, entries)
end

-- The sequence number and group in a group_of entry (false: none).
local function split_group(entry)
  if not entry then
    return nil, nil
  end
  local seq, group = string.match(entry, '^(%d+):(.+)$')
  return seq, group
end

local function parked_member(seq, id)
  return string.format('%015d:', tonumber(seq)) .. id
end

-- The group's holder is gone: its next parked message that still waits parked (one
-- cancelled, rescheduled or promoted meanwhile left a stale entry: dropped) becomes the
-- holder, back in pending at its due time. Returns its id and due time; nil when none
-- waits (the group is then free).
local function pass_group_on(group)
  local _, busy, prefix = group_names()
  local parked = prefix .. group
  while true do
    local head = call('ZRANGE', parked, 0, 0, 'WITHSCORES')
    if not head[1] then
      call('HDEL', busy, group)
      return nil, nil
    end
    call('ZREM', parked, head[1])
    local id = string.sub(head[1], 17)
    local score = call('ZSCORE', pending, id)
    if score and tonumber(score) >= PARKED then
      local due = tonumber(head[2])
      call('HSET', busy, group, id)
      call('ZADD', pending, int(due), id)
      return id, due
    end
  end
end

-- Messages that no longer hold their group (acked, buried, cancelled, deleted): each one
-- holding its group passes it on, and the workers are woken for the next holder (on the
-- queue's wake-up channel, "<tag>:wakeup", as engine/keys.py names it: ack and remove
-- are not given it). With `forget`, they also leave group_of (they leave the queue; a
-- buried one keeps its entry, so that a requeue waits for its group again).
function release_groups(ids, forget)  -- (the local declared before bury_for)
  if #ids == 0 or not groups_used() then
    return
  end
  local group_of, busy, _, channel = group_names()
  local entries, earliest = gather('HMGET', group_of, ids), nil
  for i, id in ipairs(ids) do
    local _, group = split_group(entries[i])
    if group and call('HGET', busy, group) == id then
      local _, due = pass_group_on(group)
      if due and (earliest == nil or due < earliest) then
        earliest = due
      end
    end
  end
  if earliest ~= nil then
    wake(channel, earliest)
  end
  if forget then
    local gone = {}
    for i, id in ipairs(ids) do
      if entries[i] then
        table.insert(gone, id)
      end
    end
    call_chunked('HDEL', group_of, gone)
  end
  return earliest
end

-- A parked message leaving pending (cancel, delete): its entry in its group's zset goes too.
local function unpark(id)
  local group_of, _, prefix = group_names()
  local seq, group = split_group(call('HGET', group_of, id))
  if group then
    call('ZREM', prefix .. group, parked_member(seq, id))
  end
end

-- Keyed sends (send_keys): the waiting messages a replace rewrote (`leaving`) leave the
-- group they had: a parked one leaves its group's zset, a holder passes its group on. Then
-- the created and replaced ones with a group (`joining`, {id, group, ...} in send order)
-- join it as any grouped send does, numbered after every earlier one: a replace is the
-- latest send of its key, so among equal due times it goes after those sent before it,
-- and its place follows its new due time. (It waits in pending, not parked: a fetch parks
-- it once due if its group is held. Its due time is never before now, and every parked
-- message's is, so it could not have gone before them anyway.) A replace within the same
-- group leaves and joins it again, as one that names another group or none.
function regroup(leaving, joining)  -- (the local declared before send_keys)
  if #leaving > 0 and groups_used() then
    for _, id in ipairs(leaving) do
      unpark(id)
    end
    release_groups(leaving, true)
  end
  record_groups(joining)
end

-- fetch's gate: of the due pending ids about to be staged, in order, those that may go (no
-- group; their group's holder; or the first of their group, by due time then send order,
-- when it is free: it becomes the holder), and the parked heads of free groups, returned
-- in that order; the others are parked (see above). The ids that go are still in pending
-- (the caller takes them out as it takes any due id). A holder whose message is gone (no
-- payload: an inconsistency) frees its group. The parked heads come on top of the batch,
-- at most one per group in it: a fetch still stages at most twice its bound.
local function pass_groups(ids)
  local group_of, busy, prefix = group_names()
  local entries = gather('HMGET', group_of, ids)
  local grouped, dues, touched, order = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    if entries[i] then
      table.insert(grouped, id)
    end
  end
  if #grouped == 0 then
    return ids
  end
  local scores = gather('ZMSCORE', pending, grouped)
  for i, id in ipairs(grouped) do
    dues[id] = tonumber(scores[i])
  end
  local going = {}
  for i, id in ipairs(ids) do
    local seq, group = split_group(entries[i])
    if not group then
      table.insert(going, id)
    else
      if touched[group] == nil then
        local holder = call('HGET', busy, group)
        if holder and holder ~= id and call('HEXISTS', payloads, holder) == 0 then
          holder = false
        end
        touched[group] = holder or false
        table.insert(order, group)
      end
      if touched[group] == id then
        table.insert(going, id)
      else
        call('ZADD', prefix .. group, int(dues[id]), parked_member(seq, id))
        call('ZADD', pending, int(PARKED + dues[id]), id)
      end
    end
  end
  for _, group in ipairs(order) do
    if not touched[group] then
      local head = pass_group_on(group)
      if head then
        table.insert(going, head)
      end
    end
  end
  return going
end

-- A body cut to at most `limit` bytes of its payload (see utf8_prefix), its key prefix
-- kept whole so that the reader still finds the key; and the payload's whole size.
local function preview(body, limit)
  local key, _, payload = split_key(body)
  if not key then
    return limit and utf8_prefix(body, limit) or body, string.len(body)
  end
  local prefix = string.sub(body, 1, #body - #payload)
  return prefix .. (limit and utf8_prefix(payload, limit) or payload), string.len(payload)
end

-- A dead letter's reason when it is not the default ("expired", "postponed too often";
-- see "Expiry and postpones"), else "".
local function dead_reason_of(id)
  if redis.call('TYPE', dead_reasons)['ok'] == 'hash' then
    return redis.call('HGET', dead_reasons, id) or ''
  end
  return ''
end

-- The meta record peek, lookup and list show for a message without one of its own: made
-- up from its stored payload (first_meta) for a message never handed out, as a hand-out
-- writes the first record: one waiting in pending or ready, or a dead letter its expiry
-- buried before any delivery (reason "expired"); false for any other, whose record is
-- missing. `reason` is its dead reason (dead_reason_of; "" for one not dead).
local function made_up_meta(state, reason, stored)
  if state == 'pending' or state == 'ready' or (state == 'garbage' and reason == 'expired') then
    return first_meta(stored) or false
  end
  return false
end

-- Where one message is and what it holds, for peek and lookup (read-only): {state, score,
-- payload, size, meta, unannounced, group, reason, warnings} as peek.lua's header
-- describes them; the keys in `foreign` (see foreign_keys) read as empty.
local function describe(id, preview_bytes, foreign)
  local state, score = '', -1
  for _, entry in ipairs({{'pending', pending}, {'unack', unack}, {'garbage', garbage}}) do
    if state == '' and not foreign[entry[2]] then
      local found = redis.call('ZSCORE', entry[2], id)
      if found then
        state, score = entry[1], tonumber(found)
      end
    end
  end
  for _, entry in ipairs({{'ready', ready}, {'retry', retry}}) do
    if state == '' and not foreign[entry[2]] and redis.call('LPOS', entry[2], id) then
      state = entry[1]
    end
  end
  local stored, payload, size, meta, unannounced = false, false, 0, false, 0
  if not foreign[payloads] then
    stored = redis.call('HGET', payloads, id)
  end
  if stored then
    local _, _, body = unwrap(stored)
    payload, size = preview(body, preview_bytes)
  end
  if not foreign[metas] then
    meta = redis.call('HGET', metas, id)
  end
  -- A dead letter's reason, when not the default (see "Expiry and postpones").
  local reason = ''
  if state == 'garbage' then
    reason = dead_reason_of(id)
  end
  if not meta then
    meta = made_up_meta(state, reason, stored)
  end
  if not foreign[exhausted] and redis.call('ZSCORE', exhausted, id) then
    unannounced = 1
  end
  -- Ordered groups: a parked message shows its due time, and any grouped one its group.
  if state == 'pending' and score >= PARKED then
    score = score - PARKED
  end
  local group, group_of = false, group_names()
  if redis.call('TYPE', group_of)['ok'] == 'hash' then
    local _, named = split_group(redis.call('HGET', group_of, id))
    group = named or false
  end
  return {state, score, payload, size, meta, unannounced, group, reason, warnings}
end

-- The flow hash's fields {paused, rate set at run time on this store, the whole queue's
-- rate set at run time}, all false when it does not exist (read only where the queue uses
-- a flow option: one EXISTS tells a queue that uses none).
local function flow_fields()
  if not options_unused() and redis.call('EXISTS', flow_state) == 1 then
    return call('HMGET', flow_state, 'paused', 'rate', 'queue_rate')
  end
  return {false, false, false}
end

-- The flow state as flow.lua and add_layout.lua answer it: {paused (1 or 0), the whole
-- queue's rate set at run time ("" for none)}.
local function flow_reply()
  local fields = {false, false}
  if redis.call('TYPE', flow_state)['ok'] == 'hash' then
    fields = redis.call('HMGET', flow_state, 'paused', 'queue_rate')
  end
  return {fields[1] == '1' and 1 or 0, fields[2] or ''}
end

-- Hand-outs (their entries' names) logged in the rate limit's sliding window at `now`,
-- which then expires a period (`period` ms) after this last write.
local function log_hand_outs(entries, now, period)
  call_chunked('ZADD', flow_log, at_score(int(now), entries))
  redis.call('PEXPIRE', flow_log, int(period))
end

-- The rate limit's sliding window (issue #27): how many of `count` hand-outs the log has
-- room for at `now` under `limit` per `period` ms, and when a held-back fetch should look
-- again (nil when it held nothing back). The log holds the time of every hand-out of the
-- last period, so any period-long window holds at most `limit` (no burst over it, unlike a
-- fixed window; a log rather than GCRA so that a batch fetch takes what the window allows
-- at once).
local function window_room(count, now, limit, period)
  call('ZREMRANGEBYSCORE', flow_log, '-inf', int(now - period))
  local used = call('ZCARD', flow_log)
  if used >= limit then
    -- The slot frees when the hand-out `limit` places from the newest leaves the window.
    local oldest = call('ZRANGE', flow_log, used - limit, used - limit, 'WITHSCORES')
    return 0, tonumber(oldest[2]) + period
  elseif limit - used < count then
    local head = call('ZRANGE', flow_log, 0, 0, 'WITHSCORES')
    return limit - used, head[2] and tonumber(head[2]) + period or now + period
  end
  return count, nil
end

-- The rate in force: "<limit>:<period ms>" set at run time (`override`, false for none)
-- or the setting's (`rate_setting`, "" for none), as {limit, period}, or nil for none.
local function rate_in_force(override, rate_setting)
  local limit, period = string.match(override or rate_setting, '^(%d+):(%d+)$')
  if not limit then
    return nil
  end
  return {tonumber(limit), tonumber(period)}
end

-- Flow gates (issue #27): how many of the `count` messages a fetch asked for it may hand
-- out. While the queue is paused, none. `mode` "" (a queue of one shard): under a rate
-- limit no more than the sliding window has room for (see window_room); under a cap no
-- more than `cap` minus the deliveries in flight: the unack zset is the set in flight, less
-- those whose lease already ran out (the fetch's step 1 takes them back). `rate_setting` is
-- "<limit>:<period ms>" or "", `cap` 0 for none; a rate kept in the flow hash overrides the
-- setting. A shard of a sharded queue holds no share of either: the budget for the whole
-- queue is on shard 0 (see flow_reserve.lua). Its fetches come in `mode` "reserved" (the
-- count already within the budget) or "shard" (a queue whose budget the caller did not
-- know of: with a rate set at run time on the queue, the fetch takes nothing and says so,
-- and the caller reserves from then on). Returns the allowance, when a held-back fetch
-- should look again (ms, nil when nothing held it back), the rate in force ({limit,
-- period}, nil for none) for flow_record, 1 when the fetch needs a reservation, else 0,
-- and 1 when the cap cut the allowance (below what the rest allowed), else 0.
local function flow_gate(count, now, rate_setting, cap, mode)
  local fields = flow_fields()
  if fields[1] == '1' then
    -- A paused fetch looks again within a second: resume's wake-up may be lost.
    return 0, now + 1000, nil, 0, 0
  end
  if mode == 'reserved' then
    return count, nil, nil, 0, 0
  elseif mode == 'shard' then
    if fields[3] then
      return 0, now, nil, 1, 0
    end
    return count, nil, nil, 0, 0
  end
  local allowance, again, capped = count, nil, 0
  local rate = rate_in_force(fields[2], rate_setting)
  if rate then
    allowance, again = window_room(count, now, rate[1], rate[2])
  end
  if cap > 0 then
    local in_flight = call('ZCARD', unack) - call('ZCOUNT', unack, '-inf', int(now))
    local room = math.max(cap - in_flight, 0)
    if room < allowance then
      -- A slot frees on an ack (whose worker, told by `capped`, fetches again at once) or
      -- a lease running out.
      allowance, again = room, math.min(again or now + 1000, now + 1000)
      capped = 1
    end
  end
  return allowance, again, rate, 0, capped
end

-- Logs the deliveries a rate-limited fetch handed out (flat, six fields each: see
-- fetch.lua) in the sliding window, which expires a period after its last hand-out.
local function flow_record(rate, deliveries, handed, now)
  if not rate or handed == 0 then
    return
  end
  local entries = {}
  for i = 0, handed - 1 do
    entries[i + 1] = deliveries[6 * i + 4] .. ':' .. deliveries[6 * i + 1]
  end
  log_hand_outs(entries, now, rate[2])
end

-- The entries of a sharded fetch's reservation `name` (see flow_reserve.lua), numbered
-- from `first` to `last`: "<name>:<n>".
local function reserved_entries(name, first, last)
  local entries = {}
  for n = first, last do
    entries[#entries + 1] = name .. ':' .. n
  end
  return entries
end
