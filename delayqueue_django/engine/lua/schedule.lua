--[[
  schedule: the queue's recurring messages (delayqueue_django/schedules). Writes a
  schedule's next tick, or defines, pauses, resumes or removes a schedule together with the
  tick it waits on; records that a worker declares a schedule in its settings, and retires
  a settings' schedule no worker has declared for a while. A tick is an ordinary message of the queue, id "tick:<name>:<ms>", due
  at its time; this script is the only writer of ticks, and writes each tick time of a
  schedule at most once, whoever calls it and however often (the cursor below).

  KEYS: the queue's key layout (see _prelude.lua), then
    KEYS[11] schedules       hash  name -> definition (JSON; read by Python only)
    KEYS[12] schedule_ticks  hash  name -> "fingerprint:paused:cursor:tick:previous:since"
      fingerprint  hex digest of the definition the ticks follow (computed by Python)
      paused       1 while paused: no tick is written, and none handed out runs
      cursor       ms: a tick is written only if it is later than the cursor, which it
                   then becomes; so each tick time is written once (compare-and-set)
      tick         ms of the latest tick written since the schedule was defined, changed
                   or paused, 0 if none
      previous     ms of the tick written before that one, 0 if none
      since        ms: the start of a new schedule, or of the resume that ended its latest
                   pause. A tick of a time at or before it that is handed out now was
                   written before (by a schedule of that name since removed, or before the
                   pause): workers ack it without running it. So a pause or a removal
                   stops every tick not handed out yet, however many, with no search for
                   them. (A record of five fields, written before since was kept, reads
                   as since 0.)
      (a record that does not read so, or with a number past 2^53, is damage: the
      schedule is taken for new, as Python's parse_schedule_record takes it)
    KEYS[13] schedule_failures  hash  name -> "since:reason": a worker could not write
      the schedule's ticks since that ms, for that reason (op "fail"); removed when a tick
      is written, the definition changes or the schedule is removed
    KEYS[14] schedule_declared  hash  name -> ms: when a worker that has the schedule in
      its settings (SCHEDULES) last said so (op "declare"); removed with the schedule
  ARGV[1]  op: "tick", "put", "pause", "resume", "remove", "fail", "declare" or "retire"
  ARGV[2]  wake-up channel
  ARGV[3]  name
  ARGV[4]  fingerprint (tick, put, resume and fail; remove and retire: only a schedule
           with this one, "" any)
  ARGV[5]  definition JSON (put); the reason (fail)
  ARGV[6]  expect (put): "any"; "new", refused if the schedule exists; "existing", refused
           if it does not
  ARGV[7]  start ms (put, pause, resume): the caller's reading of the clock. A schedule
           changed, paused or resumed owes no tick up to it; a new or resumed one's since.
           fail: since when it fails. retire: how long (ms) the schedule may go undeclared
  ARGV[8]  tick ms: the tick to write (tick), or the first tick of the new definition
           (put) or of the resumed schedule (resume), 0 for none; written only if it is
           later than the cursor
  ARGV[9]  retry budget of the tick's message
  ARGV[10] payload of the tick's message (JSON text)

  Returns {status, cursor, tick, previous, now, warnings}, with the record as it is after
  the call. status:
    tick    "written"; "behind" (not later than the cursor: that tick was written, by this
            caller or another); "stale" (the schedule has another fingerprint: its
            definition changed); "paused"; "missing" (no such schedule)
    put     "defined" (new, or changed: the old definition's waiting tick is removed);
            "unchanged" (the same fingerprint: the definition's text is rewritten, its
            ticks and pause kept); "exists" or "missing" (refused, see expect)
    pause   "paused" (its waiting tick removed), or "missing"
    resume  "resumed"; "stale" (paused, and another fingerprint: the first tick given is
            the old definition's, and the schedule stays paused); or "missing"
    remove  "removed" (with its waiting tick), "missing", or "stale" (another fingerprint)
    fail    "failed" (recorded), "stale" (another fingerprint: the failure is the old
            definition's) or "missing"
    declare "declared" (the declaration's time is now), or "missing" (nothing recorded)
    retire  "removed" (as remove does) if no worker declared it for ARGV[7] ms; else
            "declared" (kept; a schedule with no readable declaration counts as declared
            now, so its wait starts); "stale" (another fingerprint) or "missing"
  A waiting tick is one never handed out (pending or ready, attempt 0). A tick handed out
  has fired: it stays, and the cursor stays at or past its time. Pause and remove also
  take out the tick before the latest if it still waits (due, behind a backlog: workers
  write a tick as the one before falls due); a put leaves it, due under its definition.
  Older ticks still waiting (a catch-up's, or written ahead of a clock that stepped back)
  are not searched for: they stay, and are dropped as they are handed out (see since).
  Publishes a written tick's time when it is earlier than every pending message's.
]]

local op, channel, name = args[1], args[2], args[3]
local fingerprint, definition, expect = args[4], args[5], args[6]
local start, first = tonumber(args[7]) or 0, tonumber(args[8]) or 0
local budget, payload = tonumber(args[9]) or 0, args[10]
local schedules, schedule_ticks, schedule_failures = keys[11], keys[12], keys[13]
local schedule_declared = keys[14]

local now = now_ms()
for _, key in ipairs({schedules, schedule_ticks, schedule_failures, schedule_declared}) do
  local actual = redis.call('TYPE', key)['ok']
  if actual ~= 'none' and actual ~= 'hash' then
    table.insert(warnings, {key, 'held a ' .. actual .. ' instead of a hash; renamed to ' ..
      rename_aside(key, now)})
  end
end

local known, paused, cursor, tick, previous, since = nil, false, 0, 0, 0, 0
local raw = redis.call('HGET', schedule_ticks, name)
if raw then
  local f, p, c, t, pr, si = string.match(raw, '^(%x*):([01]):(%d+):(%d+):(%d+):(%d+)$')
  if not f then
    f, p, c, t, pr = string.match(raw, '^(%x*):([01]):(%d+):(%d+):(%d+)$')
    si = '0'
  end
  c, t, pr, si = tonumber(c), tonumber(t), tonumber(pr), tonumber(si)
  local largest = LARGEST_META_NUMBER
  if f and c <= largest and t <= largest and pr <= largest and si <= largest then
    known, paused = f, p == '1'
    cursor, tick, previous, since = c, t, pr, si
  else
    table.insert(warnings, {schedule_ticks, 'field ' .. name .. ' is unreadable; the ' ..
      'schedule is taken for new'})
  end
end
local exists = known ~= nil or redis.call('HEXISTS', schedules, name) == 1

local function reply(status)
  return {status, int(cursor), int(tick), int(previous), int(now), warnings}
end

local function save()
  redis.call('HSET', schedule_ticks, name, string.format('%s:%d:%d:%d:%d:%d', known,
    paused and 1 or 0, cursor, tick, previous, since))
end

local function tick_id(at)
  return 'tick:' .. name .. ':' .. int(at)
end

-- The tick at `at` as a message due then (written as send.lua writes a message), and the
-- cursor moved to it. An id still held by a message of the queue (a tick of that time
-- delivered early by hand, under an earlier definition) is not written over.
local function write_tick(at)
  local id = tick_id(at)
  if call('HEXISTS', payloads, id) == 0 and call('HEXISTS', metas, id) == 0 then
    local head = head_score(pending)
    call('ZADD', pending, int(at), id)
    call('HSET', payloads, id, wrap(budget, at, payload))
    if head == nil or at < head then
      wake(channel, at)
    end
  end
  if tick > 0 then
    previous = tick
  end
  cursor, tick = at, at
end

-- Takes out the tick at `at` if it was never handed out; true if it did.
local function take_out(at)
  local id = tick_id(at)
  local _, attempt = read_meta(id)
  if (attempt or 0) == 0 and (call('ZREM', pending, id) == 1
      or call('LREM', ready, 1, id) == 1) then
    call('HDEL', payloads, id)
    call('HDEL', metas, id)
    return true
  end
  return false
end

-- Takes out the tick the schedule waits on, if it was never handed out; with `due_too`
-- (pause, remove) the one before it as well: workers write a tick as the one before falls
-- due, so that one can still wait, behind a backlog. Returns 0, or the time of a tick that
-- has fired (handed out, retried, dead or done), which no later tick may take again: the
-- floor of the cursor.
local function drop_waiting_tick(due_too)
  if tick == 0 then
    return 0
  end
  if due_too and previous > 0 then
    take_out(previous)
  end
  if take_out(tick) then
    tick = 0
    return 0
  end
  local fired = tick
  previous, tick = tick, 0
  return fired
end

if op == 'tick' then
  if not known then
    return reply('missing')
  elseif paused then
    return reply('paused')
  elseif known ~= fingerprint then
    return reply('stale')
  elseif first <= cursor then
    return reply('behind')
  end
  write_tick(first)
  save()
  redis.call('HDEL', schedule_failures, name)
  return reply('written')
end

if op == 'put' then
  if expect == 'new' and exists then
    return reply('exists')
  elseif expect == 'existing' and not exists then
    return reply('missing')
  end
  redis.call('HSET', schedules, name, definition)
  if known == fingerprint then
    return reply('unchanged')
  end
  if not known then
    -- New (or its record damaged): ticks of a schedule of this name removed before, still
    -- waiting, are not this one's.
    since = start
  end
  cursor = math.max(start, drop_waiting_tick(false))
  known = fingerprint
  if first > cursor and not paused then
    write_tick(first)
  end
  save()
  redis.call('HDEL', schedule_failures, name)
  return reply('defined')
end

-- The schedule and its waiting tick (with the one before, if it still waits) removed.
local function remove()
  if known then
    drop_waiting_tick(true)
  end
  for _, key in ipairs({schedules, schedule_ticks, schedule_failures, schedule_declared}) do
    redis.call('HDEL', key, name)
  end
end

if op == 'declare' then
  if not exists then
    return reply('missing')
  end
  redis.call('HSET', schedule_declared, name, int(now))
  return reply('declared')
end

if op == 'retire' then
  if not exists then
    return reply('missing')
  elseif known and fingerprint ~= '' and known ~= fingerprint then
    return reply('stale')
  end
  local declared = tonumber(redis.call('HGET', schedule_declared, name) or '')
  if declared == nil or declared > now then
    -- No readable declaration (a worker between its put and its declare, a record lost or
    -- damaged), or one from a clock that was ahead: the wait starts now.
    redis.call('HSET', schedule_declared, name, int(now))
    return reply('declared')
  elseif now - declared < start then
    return reply('declared')
  end
  remove()
  return reply('removed')
end

if not known then
  if op == 'remove' and exists then
    remove()
    return reply('removed')
  end
  return reply('missing')
end

if op == 'pause' then
  cursor = math.max(start, drop_waiting_tick(true))
  paused = true
  save()
  return reply('paused')
end

if op == 'resume' then
  if paused and known ~= fingerprint then
    return reply('stale')
  elseif paused then
    paused, since = false, start
    cursor = math.max(start, cursor)
    if first > cursor then
      write_tick(first)
    end
    save()
  end
  return reply('resumed')
end

if op == 'remove' then
  if fingerprint ~= '' and known ~= fingerprint then
    return reply('stale')
  end
  remove()
  return reply('removed')
end

if op == 'fail' then
  if known ~= fingerprint then
    return reply('stale')
  end
  redis.call('HSET', schedule_failures, name, int(start) .. ':' .. definition)
  return reply('failed')
end

return redis.error_reply('unknown schedule op ' .. op)
