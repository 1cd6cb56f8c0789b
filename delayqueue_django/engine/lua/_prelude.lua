--[[
  Shared prelude, prepended to every script of this folder when it is loaded.

  Every script receives the same KEYS, all sharing the queue's hash tag so that a
  script touches a single Redis Cluster slot:
    KEYS[1] pending    zset  id -> due time (ms, server clock)
    KEYS[2] ready      list  ids due for their first delivery (bounded staging list)
    KEYS[3] unack      zset  id -> redelivery deadline (ms)
    KEYS[4] retry      list  ids due for redelivery (bounded staging list)
    KEYS[5] garbage    zset  id -> time its retries ran out (ms)
    KEYS[6] payload    hash  id -> JSON payload
    KEYS[7] meta       hash  id -> "lease:attempt:budget:due"
    KEYS[8] exhausted  zset  id -> earliest time its exhaustion may be announced (ms)
    KEYS[9] quarantine any   where a structure of the wrong type is moved aside
    KEYS[10] throughput hash "<minute>:acked" / "<minute>:failed" -> count, minute being
                             the Redis clock's ms // 60000 (pruned by prune_throughput);
                             and running totals since the queue began, never pruned:
                             "all:acked", "all:failed" (refusals and timeouts),
                             "all:retried" (deliveries scheduled again), "all:timed_out",
                             "all:exhausted" (buried with retries used up or refused)

  meta fields: lease   the delivery token, bumped on every state change of a delivery,
                       so a late ack or nack from an older delivery never matches;
               attempt deliveries counted against the budget (1 on first delivery);
               budget  retries allowed after the first delivery;
               due     when the message last became due (ms): its send or retry time,
                       the moment it was requeued or promoted, or the deadline of a
                       delivery that timed out. Handed out with each delivery so that
                       workers can measure how late it started.
]]

local pending, ready, unack, retry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local garbage, payloads, metas, exhausted = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local quarantine, throughput = KEYS[9], KEYS[10]

-- Problems met on the way ({id-or-key, reason} pairs); every script returns them
-- last so the client can log them. Damage never stops the queue.
local warnings = {}

-- In a fixed order, so that the outcome never depends on table iteration order.
local EXPECTED_TYPES = {
  {pending, 'zset'}, {ready, 'list'}, {unack, 'zset'}, {retry, 'list'},
  {garbage, 'zset'}, {payloads, 'hash'}, {metas, 'hash'}, {exhausted, 'zset'},
  {throughput, 'hash'},
}

-- Scores and other numbers go to Redis through "%d": Lua's default conversion keeps
-- only 14 significant digits, which would round far-future times.
local function int(n)
  return string.format('%d', n)
end

-- The microseconds past the millisecond of the last now_ms() reading: fetch hands them
-- out, so that workers can time their wake-ups to the due time, not up to 1 ms after it.
local now_us = 0

local function now_ms()
  local t = redis.call('TIME')
  now_us = tonumber(t[2]) % 1000
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A key holding the wrong type would make every later command on it fail and stop
-- the queue; mutating scripts rename it aside instead and carry on with an empty one.
local function quarantine_foreign_keys()
  for _, entry in ipairs(EXPECTED_TYPES) do
    local key, expected = entry[1], entry[2]
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= expected then
      redis.call('RENAME', key, quarantine)
      table.insert(warnings, {key, 'held a ' .. actual .. ' instead of a ' .. expected ..
        '; renamed to ' .. quarantine})
    end
  end
end

-- Read-only scripts do not move anything: they report the key and treat it as empty.
local function foreign_keys()
  local foreign = {}
  for _, entry in ipairs(EXPECTED_TYPES) do
    local key, expected = entry[1], entry[2]
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= expected then
      foreign[key] = true
      table.insert(warnings, {key, 'holds a ' .. actual .. ' instead of a ' .. expected})
    end
  end
  return foreign
end

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
  return tonumber(lease), tonumber(attempt), tonumber(budget), tonumber(due)
end

local function read_meta(id)
  return parse_meta(redis.call('HGET', metas, id))
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

local function write_meta(id, lease, attempt, budget, due)
  redis.call('HSET', metas, id, format_meta(lease, attempt, budget, due))
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
    redis.call(command, key, unpack(values, first, math.min(first + CHUNK - 1, total)))
  end
end

-- The same for a read that answers one value per member (HMGET, ZMSCORE): returns the
-- answers joined in the order of `values`; a missing field or member reads as false.
local function gather(command, key, values)
  local answers, total, count = {}, #values, 0
  for first = 1, total, CHUNK do
    local last = math.min(first + CHUNK - 1, total)
    local part = redis.call(command, key, unpack(values, first, last))
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

-- Running totals for monitoring: counted here, in the step that makes them true, they add
-- up across any number of workers and survive a worker's crash.
local function count_total(what, n)
  if n > 0 then
    redis.call('HINCRBY', throughput, 'all:' .. what, n)
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

local function damage_of(id, has_payload, lease)
  if not lease then
    return 'meta record missing or unreadable; moved to garbage'
  end
  if not has_payload then
    return 'payload missing; moved to garbage'
  end
  return nil
end

-- Wakes idle workers when the earliest due time moved earlier (or work is waiting).
local function wake(channel, due)
  redis.call('PUBLISH', channel, int(due))
end

-- Per-minute counts of acked and failed deliveries, and their totals, for monitoring.
local function count_throughput(now, what, n)
  if n > 0 then
    redis.call('HINCRBY', throughput, int(math.floor(now / 60000)) .. ':' .. what, n)
    count_total(what, n)
  end
end

local function head_score(key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return nil
end
