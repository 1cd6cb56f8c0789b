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

  KEYS: the queue's key layout (see _prelude.lua); uses all of them.
  ARGV[1]  wake-up channel
  ARGV[2]  count, the most messages to hand out (0 just runs the housekeeping)
  ARGV[3]  consume_ms, how long a delivery may stay unacked before redelivery
  ARGV[4]  stage_limit, the bound on ids moved and on the staging lists' length

  Returns {now_ms, next_ms, expired, deliveries, owed, warnings}:
    now_ms      the Redis server's clock
    next_ms     when this consumer should look again: now_ms if work is waiting,
                else the earliest pending due time, unack deadline or lapse of an
                exhaustion claim, or -1 if there is none
    expired     how many deliveries timed out in step 1
    deliveries  flat list: id, payload, attempt, lease, budget, due for each message
                handed out
    owed        1 if an exhaustion is waiting to be announced (see claim_exhausted)
  Publishes now_ms when work is still waiting after a full batch, to wake idle peers.
]]

local channel, count = ARGV[1], tonumber(ARGV[2])
local consume_ms, stage_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
quarantine_foreign_keys()
local now = now_ms()

local function room()
  return stage_limit - redis.call('LLEN', ready) - redis.call('LLEN', retry)
end

-- 1. Deliveries that outlived their deadline.
local expired = 0
local free = room()
if free > 0 then
  local timed_out = redis.call('ZRANGE', unack, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free,
    'WITHSCORES')
  for i = 1, #timed_out, 2 do
    local id, deadline = timed_out[i], tonumber(timed_out[i + 1])
    redis.call('ZREM', unack, id)
    local lease, attempt, budget = read_meta(id)
    if not lease then
      set_aside(id, now, 'meta record missing or unreadable; moved to garbage')
    else
      expired = expired + 1
      -- Its redelivery is due from the moment the deadline passed.
      write_meta(id, lease + 1, attempt, budget, deadline)
      if attempt > budget then
        bury(id, now)
      else
        redis.call('RPUSH', retry, id)
        count_total('retried', 1)
      end
    end
  end
end

count_throughput(now, 'failed', expired)
count_total('timed_out', expired)

-- 2. Pending messages whose time has come.
free = room()
if free > 0 then
  local ids = redis.call('ZRANGE', pending, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free)
  for _, id in ipairs(ids) do
    redis.call('ZREM', pending, id)
    local lease, attempt = read_meta(id)
    if not lease then
      set_aside(id, now, 'meta record missing or unreadable; moved to garbage')
    elseif attempt > 0 then
      redis.call('RPUSH', retry, id)
    else
      redis.call('RPUSH', ready, id)
    end
  end
end

-- 3. Hand out, redeliveries first: they have waited longest.
local deliveries = {}
local handed = 0
local deadline = int(now + consume_ms)
for _, source in ipairs({retry, ready}) do
  local want = count - handed
  if want <= 0 then
    break
  end
  local ids = redis.call('LPOP', source, want)
  if ids then
    for _, id in ipairs(ids) do
      local payload = redis.call('HGET', payloads, id)
      local lease, attempt, budget, due = read_meta(id)
      local damage = damage_of(id, payload, lease)
      if damage then
        set_aside(id, now, damage)
      else
        write_meta(id, lease + 1, attempt + 1, budget, due)
        redis.call('ZADD', unack, deadline, id)
        table.insert(deliveries, id)
        table.insert(deliveries, payload)
        table.insert(deliveries, attempt + 1)
        table.insert(deliveries, lease + 1)
        table.insert(deliveries, budget)
        table.insert(deliveries, due)
        handed = handed + 1
      end
    end
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

return {now, next_ms, expired, deliveries, owed, warnings}
