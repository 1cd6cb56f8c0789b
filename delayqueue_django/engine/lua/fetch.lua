--[[
  fetch: hand out up to `count` due messages to one consumer, moving them to unack in
  the same step, after the bounded housekeeping that makes messages due:
    1. deliveries whose deadline passed go to retry (or to garbage when their
       retries are used up), and count as failed in throughput;
    2. due pending messages are staged: to ready (first delivery) or retry;
    3. up to `count` ids are popped, retry first, and leased until now + consume_ms.
  Steps 1 and 2 together move at most `stage_limit` ids, and only while the staging
  lists (ready + retry) hold fewer than `stage_limit`, so every call is bounded and
  a cancel's LREM on a staging list is bounded too.

  A fetch's reply can be lost after Redis ran it (a connection cut, a client timing
  out while Redis was paused, a client re-sending on its own): its messages would sit
  in unack with nobody handling them, and each such loss would use up an attempt. So a
  fetcher names each request; the fetch records what it handed out, and a fetch that
  repeats the fetcher's last request hands those deliveries out again, under new
  leases and without counting another attempt, instead of taking new ones.

  KEYS: the queue's key layout (see _prelude.lua); uses all of them; and
  KEYS[11] the fetcher's replay record: a list [request, id, lease, id, lease, ...]
           of its last fetch, expiring with those deliveries' lease (consume_ms)
  ARGV[1]  wake-up channel
  ARGV[2]  count, the most messages to hand out (0 just runs the housekeeping)
  ARGV[3]  consume_ms, how long a delivery may stay unacked before redelivery
  ARGV[4]  stage_limit, the bound on ids moved and on the staging lists' length
  ARGV[5]  request, this fetch's id ("": no replay record)

  Returns {now_ms, next_ms, expired, deliveries, owed, now_us, warnings}:
    now_ms      the Redis server's clock
    next_ms     when this consumer should look again: now_ms if work is waiting,
                else the earliest pending due time, unack deadline or lapse of an
                exhaustion claim, or -1 if there is none
    expired     how many deliveries timed out in step 1
    deliveries  flat list: id, payload, attempt, lease, budget, due for each message
                handed out
    owed        1 if an exhaustion is waiting to be announced (see claim_exhausted)
    now_us      the microseconds past now_ms on the server's clock (0-999)
  Publishes now_ms when work is still waiting after a full batch, to wake idle peers.
]]

local channel, count = ARGV[1], tonumber(ARGV[2])
local consume_ms, stage_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local record_key, request = KEYS[11], ARGV[5]
quarantine_foreign_keys()
local now = now_ms()
local deadline = int(now + consume_ms)
local expired, handed, deliveries = 0, 0, {}
-- The new meta records and unack entries of the deliveries, written once at the end.
local records, leased = {}, {}

local function room()
  return stage_limit - redis.call('LLEN', ready) - redis.call('LLEN', retry)
end

-- Hands a message out under the next lease until the deadline; returns its new record.
-- Appended by index, which costs Lua a fraction of table.insert's call: this runs for
-- every message handed out.
local function lease_out(id, payload, lease, attempt, budget, due)
  local record = format_meta(lease + 1, attempt, budget, due)
  local pair, six = 2 * handed, 6 * handed
  records[pair + 1], records[pair + 2] = id, record
  leased[pair + 1], leased[pair + 2] = deadline, id
  deliveries[six + 1], deliveries[six + 2], deliveries[six + 3] = id, payload, attempt
  deliveries[six + 4], deliveries[six + 5], deliveries[six + 6] = lease + 1, budget, due
  handed = handed + 1
  return record
end

local function take_due()
  -- Each step below reads its whole batch with one command per key (HMGET, ...) and writes
  -- it the same way, instead of a few commands per message (see "Batches" in the prelude).

  -- 1. Deliveries that outlived their deadline.
  local free = room()
  if free > 0 then
    local timed_out = redis.call('ZRANGE', unack, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free,
      'WITHSCORES')
    local ids, deadlines = {}, {}
    for i = 1, #timed_out, 2 do
      table.insert(ids, timed_out[i])
      table.insert(deadlines, tonumber(timed_out[i + 1]))
    end
    call_chunked('ZREM', unack, ids)
    local raw = gather('HMGET', metas, ids)
    local expired_records, to_retry, to_bury, aside = {}, {}, {}, {}
    for i, id in ipairs(ids) do
      local lease, attempt, budget = parse_meta(raw[i])
      if not lease then
        note_damage(aside, id, 'meta record missing or unreadable; moved to garbage')
      else
        expired = expired + 1
        -- Its redelivery is due from the moment the deadline passed.
        table.insert(expired_records, id)
        table.insert(expired_records, format_meta(lease + 1, attempt, budget, deadlines[i]))
        if attempt > budget then
          table.insert(to_bury, id)
        else
          table.insert(to_retry, id)
        end
      end
    end
    -- Written now: step 3 may hand these out again and reads their records.
    call_chunked('HSET', metas, expired_records)
    set_aside(aside, now)
    bury(to_bury, now)
    call_chunked('RPUSH', retry, to_retry)
    count_total('retried', #to_retry)
  end

  count_throughput(now, 'failed', expired)
  count_total('timed_out', expired)

  -- 2. Pending messages whose time has come. Each staging list keeps their order.
  free = room()
  if free > 0 then
    local ids = redis.call('ZRANGE', pending, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free)
    call_chunked('ZREM', pending, ids)
    local raw = gather('HMGET', metas, ids)
    local to_retry, to_ready, aside = {}, {}, {}
    for i, id in ipairs(ids) do
      local lease, attempt = parse_meta(raw[i])
      if not lease then
        note_damage(aside, id, 'meta record missing or unreadable; moved to garbage')
      elseif attempt > 0 then
        table.insert(to_retry, id)
      else
        table.insert(to_ready, id)
      end
    end
    set_aside(aside, now)
    call_chunked('RPUSH', retry, to_retry)
    call_chunked('RPUSH', ready, to_ready)
  end

  -- 3. Hand out, redeliveries first: they have waited longest.
  local aside = {}
  -- The meta records this step has written so far, by id. Only a damaged queue lists an id
  -- twice; its second delivery must then build on the first, as when each record was
  -- written before the next one was read.
  local written = {}
  for _, source in ipairs({retry, ready}) do
    local want = count - handed
    if want <= 0 then
      break
    end
    local ids = redis.call('LPOP', source, want)
    if ids then
      local payload_of, raw = gather('HMGET', payloads, ids), gather('HMGET', metas, ids)
      for i, id in ipairs(ids) do
        local payload = payload_of[i]
        local lease, attempt, budget, due = parse_meta(written[id] or raw[i])
        local damage = damage_of(id, payload, lease)
        if damage then
          note_damage(aside, id, damage)
        else
          written[id] = lease_out(id, payload, lease, attempt + 1, budget, due)
        end
      end
    end
  end
  set_aside(aside, now)
end

-- The deliveries of the fetcher's last request, handed out again (its reply was lost):
-- those still in unack under the lease it gave them, under new leases and deadlines; the
-- attempt was counted when they were first handed out. Any acked, refused or timed out
-- since are left alone.
local function hand_out_again(recorded)
  local ids, leases = {}, {}
  for i = 2, #recorded, 2 do
    table.insert(ids, recorded[i])
    table.insert(leases, tonumber(recorded[i + 1]))
  end
  local payload_of, raw = gather('HMGET', payloads, ids), gather('HMGET', metas, ids)
  local in_flight = gather('ZMSCORE', unack, ids)
  for i, id in ipairs(ids) do
    local lease, attempt, budget, due = parse_meta(raw[i])
    if holds(lease, leases[i]) and in_flight[i] and payload_of[i] then
      lease_out(id, payload_of[i], lease, attempt, budget, due)
    end
  end
end

local recorded = nil
if request ~= '' then
  recorded = redis.call('LRANGE', record_key, 0, -1)
  if recorded[1] ~= request then
    recorded = nil
  end
end
if recorded then
  hand_out_again(recorded)
else
  take_due()
end
call_chunked('HSET', metas, records)
call_chunked('ZADD', unack, leased)

-- Record what this request handed out (each delivery's id and lease), for a repeat of it;
-- a new request means the fetcher received the reply to its last one, whose record is
-- then of no more use.
if request ~= '' then
  redis.call('DEL', record_key)
  if handed > 0 then
    local entries = {request}
    for i = 0, handed - 1 do
      entries[2 * i + 2], entries[2 * i + 3] = deliveries[6 * i + 1], deliveries[6 * i + 4]
    end
    call_chunked('RPUSH', record_key, entries)
    redis.call('PEXPIRE', record_key, consume_ms)
  end
end

-- When to look again.
local next_ms = -1
local waiting = redis.call('LLEN', ready) + redis.call('LLEN', retry) > 0
local pending_head, unack_head = head_score(pending), head_score(unack)
if waiting or (pending_head and pending_head <= now) or (unack_head and unack_head <= now) then
  next_ms = now
  if count > 0 and handed == count then
    wake(channel, now)
  end
end

-- An exhaustion to announce now, or a claim that lapses later (its announcer may be dead).
local owed = 0
local exhausted_head = head_score(exhausted)
if exhausted_head and exhausted_head <= now then
  owed = 1
end

if next_ms < 0 then
  for _, score in ipairs({pending_head or -1, unack_head or -1, exhausted_head or -1}) do
    if score > now and (next_ms < 0 or score < next_ms) then
      next_ms = score
    end
  end
end

return {now, next_ms, expired, deliveries, owed, now_us, warnings}
