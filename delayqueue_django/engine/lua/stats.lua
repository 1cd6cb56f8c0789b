--[[
  stats: every count of the queue, read in one consistent step (read-only).

  KEYS: the queue's key layout (see _prelude.lua); reads all but quarantine.
  ARGV: none.

  Returns {pending, ready, unack, retry, garbage, due, unannounced, now_ms,
  next_due_ms, lag_ms, acked, failed, retried, timed_out, exhausted, superseded, expired,
  postponed, paused, warnings}:
    due          pending messages whose time has come but not yet staged by a worker,
                 parked ones of ordered groups included (they wait for their group)
    unannounced  exhausted messages whose message_exhausted signal is still owed
    next_due_ms  the earliest due time in pending, parked messages left out (-1 when
                 none is left)
    lag_ms       how long the oldest due message not yet handed out has been waiting (0 if
                 none): the oldest due in pending, parked ones left out, or the next of
                 either staging list, whichever is due longest (see staged_lag)
    acked …      the running totals kept in throughput (see _prelude.lua)
    paused       1 while the queue is paused (see "Flow gates" in the prelude), else 0
]]

local foreign = foreign_keys()
local now = now_ms()

local function size(key, command)
  if foreign[key] then
    return 0
  end
  return redis.call(command, key)
end

-- A parked message (scored PARKED + its due time: see "Ordered groups" in the prelude) is
-- due and waits for its group, not for a worker: it counts as due, but neither the next
-- due time nor the lag is its (with only parked ones pending, there is no next due time).
local next_due, due, lag = -1, 0, 0
if not foreign[pending] then
  next_due = head_score(pending) or -1
  if next_due >= PARKED then
    next_due = -1
  end
  due = redis.call('ZCOUNT', pending, '-inf', int(now))
    + redis.call('ZCOUNT', pending, int(PARKED), '+inf')
  if next_due >= 0 and next_due <= now then
    lag = now - next_due
  end
end

-- A staging list's messages are due and wait for a worker as those in pending do (up to
-- STAGE_BATCH_SIZE of them, and those a stopping worker handed back), so lag counts them
-- too (issue #33). Each list hands out from its head, where what waited there longest is
-- (staged in due order, handed back to the front), so the head stands for the list: a few
-- reads here, and nothing added to a fetch. Its due time is in its meta record, or, for a
-- message never handed out, at the start of its payload.
local function staged_lag(list)
  if foreign[list] then
    return 0
  end
  local id = redis.call('LINDEX', list, 0)
  if not id then
    return 0
  end
  local record = not foreign[metas] and redis.call('HGET', metas, id)
  if not record and not foreign[payloads] then
    record = first_meta(redis.call('HGET', payloads, id))
  end
  local _, _, _, due = parse_meta(record)
  if due and due > 0 and due <= now then
    return now - due
  end
  return 0
end
lag = math.max(lag, staged_lag(ready), staged_lag(retry))

local totals = {0, 0, 0, 0, 0, 0, 0, 0}
if not foreign[throughput] then
  totals = redis.call('HMGET', throughput, 'all:acked', 'all:failed', 'all:retried',
    'all:timed_out', 'all:exhausted', 'all:superseded', 'all:expired', 'all:postponed')
end

-- (One EXISTS on a queue never paused, as fetch pays.)
local paused = 0
if redis.call('EXISTS', flow_state) == 1 and redis.call('TYPE', flow_state)['ok'] == 'hash'
  and redis.call('HGET', flow_state, 'paused') == '1' then
  paused = 1
end

return {
  size(pending, 'ZCARD'), size(ready, 'LLEN'), size(unack, 'ZCARD'), size(retry, 'LLEN'),
  size(garbage, 'ZCARD'), due, size(exhausted, 'ZCARD'), now, next_due, lag,
  tonumber(totals[1]) or 0, tonumber(totals[2]) or 0, tonumber(totals[3]) or 0,
  tonumber(totals[4]) or 0, tonumber(totals[5]) or 0, tonumber(totals[6]) or 0,
  tonumber(totals[7]) or 0, tonumber(totals[8]) or 0, paused, warnings,
}
