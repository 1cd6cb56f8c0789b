--[[
  fetch: hand out up to `count` due messages to one consumer, moving them to unack in
  the same step, after the bounded housekeeping that makes messages due:
    1. deliveries whose deadline passed go to retry (or to garbage when their
       retries are used up), and count as failed in throughput; a keyed one whose
       key's message is another one, waiting, is superseded: removed (see settle_keys
       in the prelude);
    2. due pending messages are staged: to ready (first delivery) or retry; a grouped one
       whose group another message holds is parked instead, and a free group's next
       parked message comes with them (see "Ordered groups" in the prelude);
    3. up to `count` ids are taken, retry first, and leased until now + consume_ms.
  Expiry: in steps 2 and 3, a message whose expiry passed is dead-lettered with the reason
  "expired" instead (see drop_expired below), on a queue that ever had one.
  Steps 1 and 2 together move at most `stage_limit` ids, and only while the staging
  lists (ready + retry) hold fewer than `stage_limit`, so every call is bounded and
  a cancel's LREM on a staging list is bounded too. What step 3 takes of the ids staged
  in this call is handed out at once, in list order after those already listed; only the
  rest is pushed to the lists.

  A fetch's reply can be lost after Redis ran it (a connection cut, a client timing
  out while Redis was paused, a client re-sending on its own): its messages would sit
  in unack with nobody handling them, and each such loss would use up an attempt. So a
  fetcher names each request; the fetch records what it handed out, and a fetch that
  repeats the fetcher's last request hands those deliveries out again, under new
  leases and without counting another attempt, instead of taking new ones.

  KEYS: the queue's key layout (see _prelude.lua); uses all of them; and
  KEYS[11] the fetcher's replay record: a string, msgpack of the request and the list
           {id, lease, id, lease, ...} of its last fetch, expiring with those deliveries'
           lease (consume_ms)
  ARGV[1]  wake-up channel
  ARGV[2]  count, the most messages to hand out (0 just runs the housekeeping)
  ARGV[3]  consume_ms, how long a delivery may stay unacked before redelivery
  ARGV[4]  stage_limit, the bound on ids moved and on the staging lists' length
  ARGV[5]  request, this fetch's id ("": no replay record)
  ARGV[6]  the RATE_LIMIT setting, "<limit>:<period ms>", or "" for none (flow gates)
  ARGV[7]  the MAX_IN_FLIGHT setting, 0 for none (flow gates)
  ARGV[8]  the flow gates' mode (see flow_gate in the prelude): "" on a queue of one shard;
           "reserved" or "shard" on a shard of a sharded queue, asked within a reservation
           of the whole queue's budget (flow_reserve.lua) or without one
  ARGV[9]  for "reserved": when the reservation was made (ms, shard 0's clock), from which
           the leases run: a delivery's hand-out time is the one its reservation logged
           ("" for now)
  ARGV[10] for "reserved": "1" when the reservation granted less than the fetch wanted:
           the gates, not the work, bound `count`, so handing all of it out wakes no peer
  ARGV[11] the most attempt records a message keeps (HISTORY_ATTEMPTS; missing: 0): a
           delivery whose deadline passed in step 1 leaves a record of its attempt with
           the verdict "lease expired", ended at its deadline, its start and worker not
           known (see "Attempt records" in the prelude)

  Returns {now_ms, next_ms, expired, deliveries, owed, now_us, tracked, groups, unreserved,
  capped, warnings}:
    now_ms      the Redis server's clock
    next_ms     when this consumer should look again: now_ms if work is waiting,
                else the earliest pending due time, unack deadline or lapse of an
                exhaustion claim, or -1 if there is none; when the flow gates hold
                waiting work back, when they may let some go (always later than now_ms)
    expired     how many deliveries timed out in step 1
    deliveries  flat list: id, payload, attempt, lease, budget, due for each message
                handed out
    owed        1 if an exhaustion is waiting to be announced (see claim_exhausted)
    now_us      the microseconds past now_ms on the server's clock (0-999)
    tracked     1 if the queue has expiries, postpone counts or ordered groups (see
                "Expiry and postpones" and "Ordered groups" in the prelude): acks of these
                deliveries must clean them up or pass the groups on
    groups      on a queue that has had ordered groups, each delivery's group, in order
                (false for none); else empty, so that other queues pay nothing for it
    unreserved  1 if a fetch of mode "shard" took nothing because the queue has a rate set
                at run time: its fetches must reserve (flow_reserve.lua) from now on
    capped      1 if MAX_IN_FLIGHT held waiting work back (next_ms is then its look a
                second on): a slot an ack frees lets some go, so the acker fetches again
                at once instead
  Publishes now_ms when work is still waiting after a full batch, to wake idle peers (not
  when the flow gates bound the batch).
]]

local channel, count = args[1], tonumber(args[2])
local consume_ms, stage_limit = tonumber(args[3]), tonumber(args[4])
local record_key, request = keys[11], args[5]
local now = now_ms()
local deadline = int((tonumber(args[9] or '') or now) + consume_ms)
local expired, handed, deliveries = 0, 0, {}
-- The new meta records and unack entries of the deliveries, written once at the end.
local records, leased = {}, {}
-- The staging lists' lengths, the earliest delivery deadline and pending due time, read
-- once and kept up to date below rather than asked again; unack_moved when the deadline
-- must be read again, pending_head nil until read. At a trickle, and on any queue between
-- bursts, the lists, unack, the exhaustion claims and the flow options' keys are all
-- absent: one EXISTS of them all says so (`quiet`), in place of the four reads that tell
-- each (and the queue is then known to use no flow option: see options_unused). Where
-- any exists, those four follow, as before this read.
local group_of = group_names()
local quiet = redis.call('EXISTS', ready, retry, unack, exhausted, flow_state, expiries,
  postpone_counts, group_of) == 0
local ready_len, retry_len, unack_head = 0, 0, nil
if quiet then
  options_absent = true
else
  if redis.call('EXISTS', ready, retry) > 0 then
    ready_len, retry_len = call('LLEN', ready), call('LLEN', retry)
  end
  unack_head = head_score(unack)
end
local unack_moved = false
local pending_head, pending_read = nil, false

-- Expiry (flow-expiry): of `ids`, those whose expiry passed are dead-lettered with the
-- reason "expired"; returns the others, in order. Bounded by the step that calls it.
-- `expiring` (the queue has expiries or postpone counts) is also handed out, so that an
-- ack of what this call hands out skips them when it is false (see ack.lua). Read once,
-- and only by a call that stages or hands out something: an idle fetch pays nothing.
local expiring = nil
local function is_expiring()
  if expiring == nil then
    expiring = not options_unused() and redis.call('EXISTS', expiries, postpone_counts) > 0
  end
  return expiring
end
local function drop_expired(ids)
  if #ids == 0 or not is_expiring() then
    return ids
  end
  local at = {}
  for i = 1, #ids do
    at[i] = now
  end
  local gone = expired_among(ids, at)
  if next(gone) == nil then
    return ids
  end
  local kept, dead = {}, {}
  for _, id in ipairs(ids) do
    table.insert(gone[id] and dead or kept, id)
  end
  -- A holder of an ordered group passes it on: the group's next message is back in pending,
  -- maybe due now, where the head read before may be its parked score (issue #33).
  local passed = bury_for(dead, now, 'expired', 'expired')
  if passed and (pending_head == nil or passed < pending_head) then
    pending_head = passed
  end
  return kept
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

-- Timed-out keyed messages go back to waiting only if no other waiting message is their
-- key's (see settle_keys in the prelude); the others are superseded: removed. Returns the
-- retries left to stage. (The ids left the unack zset above: `moved` says where they go.)
local function settle_timed_out(staged, buried, damaged)
  local moved = {}
  for _, ids in ipairs({buried, damaged}) do
    for _, id in ipairs(ids) do
      moved[id] = false
    end
  end
  local superseded = settle_keys(staged, gather('HMGET', payloads, staged), moved)
  local kept, gone = {}, {}
  for _, id in ipairs(staged) do
    table.insert(superseded[id] and gone or kept, id)
  end
  remove_superseded(gone)
  return kept
end

local function take_due()
  -- Each step below reads its whole batch with one command per key (HMGET, ...) and writes
  -- it the same way, instead of a few commands per message (see "Batches" in the prelude).
  -- The ids staged in this call, in order, for the retry and ready lists; and the meta
  -- record of each id this call read or wrote, which is the one to build on.
  local staged_retry, staged_ready, known, aside = {}, {}, {}, {}

  -- 1. Deliveries that outlived their deadline.
  local free = stage_limit - ready_len - retry_len
  if free > 0 and unack_head and unack_head <= now then
    local timed_out = call('ZRANGE', unack, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free,
      'WITHSCORES')
    local ids, deadlines = {}, {}
    for i = 1, #timed_out, 2 do
      table.insert(ids, timed_out[i])
      table.insert(deadlines, tonumber(timed_out[i + 1]))
    end
    call_chunked('ZREM', unack, ids)
    unack_moved = true
    local raw = gather('HMGET', metas, ids)
    local expired_records, to_bury, lapsed = {}, {}, {}
    for i, id in ipairs(ids) do
      local lease, attempt, budget = parse_meta(raw[i])
      if not lease then
        note_damage(aside, id, 'meta record missing or unreadable; moved to garbage')
      else
        expired = expired + 1
        table.insert(lapsed, {id, {attempt, 'lease expired', '', '', '', '', cjson.null,
          deadlines[i], ''}})
        -- Its redelivery is due from the moment the deadline passed.
        local record = format_meta(lease + 1, attempt, budget, deadlines[i])
        known[id] = record
        table.insert(expired_records, id)
        table.insert(expired_records, record)
        if attempt > budget then
          table.insert(to_bury, id)
        else
          table.insert(staged_retry, id)
        end
      end
    end
    call_chunked('HSET', metas, expired_records)
    record_attempts(lapsed, tonumber(args[11] or '0') or 0)
    bury(to_bury, now)
    -- Ordered groups: a buried holder passes its group on; staged below if due.
    release_groups(to_bury, false)
    if #staged_retry > 0 and keys_used() then
      staged_retry = settle_timed_out(staged_retry, to_bury, aside)
    end
    count_total('retried', #staged_retry)
    free = free - #staged_retry
  end

  count_throughput(now, 'failed', expired)
  count_total('timed_out', expired)

  -- 2. Pending messages whose time has come. Each staging list keeps their order. One
  -- never handed out has no meta record (see wrap): a first delivery, staged as it is.
  if free > 0 then
    -- The two earliest first: when no more than one of them is due (a trickle, or nothing
    -- due yet), they are all this step needs, and tell the earliest left after it.
    local first = call('ZRANGE', pending, 0, 1, 'WITHSCORES')
    local ids = {}
    if first[4] and tonumber(first[4]) <= now then
      ids = call('ZRANGE', pending, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, free)
    elseif first[2] and tonumber(first[2]) <= now then
      pending_head, pending_read = tonumber(first[4]), true
      ids = {first[1]}
    else
      pending_head, pending_read = tonumber(first[2]), true
    end
    if #ids > 0 then
      -- Ordered groups: what must wait for its group is parked (see pass_groups).
      if not options_unused() and groups_used() then
        ids = pass_groups(ids)
      end
      call_chunked('ZREM', pending, ids)
      local raw = gather('HMGET', metas, ids)
      for i, id in ipairs(ids) do
        if not raw[i] then
          table.insert(staged_ready, id)
        else
          local lease, attempt = parse_meta(raw[i])
          if not lease then
            note_damage(aside, id, 'meta record missing or unreadable; moved to garbage')
          else
            known[id] = raw[i]
            table.insert(attempt > 0 and staged_retry or staged_ready, id)
          end
        end
      end
    end
  end
  staged_retry, staged_ready = drop_expired(staged_retry), drop_expired(staged_ready)

  -- 3. Hand out, redeliveries first: they have waited longest. From each list, those
  -- already listed first, then those staged above; the staged ones left are listed.
  local function hand_out(list, listed, staged)
    local want = count - handed
    local popped = {}
    if want > 0 and listed > 0 then
      popped = call('LPOP', list, want) or {}
    end
    local took = #popped
    popped = drop_expired(popped)
    local ids, taken = {}, 0
    for i, id in ipairs(popped) do
      ids[i] = id
    end
    while #ids < want and taken < #staged do
      taken = taken + 1
      ids[#ids + 1] = staged[taken]
    end
    if #ids > 0 then
      -- The meta records of those listed before (the staged ones' are known, or they have
      -- none); a message never handed out has its first made from its payload.
      local payload_of, raw = gather('HMGET', payloads, ids), gather('HMGET', metas, popped)
      for i, id in ipairs(ids) do
        local payload = payload_of[i]
        local record = known[id] or raw[i]
        local lease, attempt, budget, due, body
        if record or not payload then
          lease, attempt, budget, due = parse_meta(record)
        else
          -- Never handed out: its first record, as first_meta would make it, read at once.
          lease, attempt, budget, due, body = first_fields(payload)
        end
        local damage = damage_of(id, payload, lease)
        if damage then
          note_damage(aside, id, damage)
        else
          if not body then
            local _
            _, _, body = unwrap(payload)
          end
          known[id] = lease_out(id, body, lease, attempt + 1, budget, due)
        end
      end
    end
    local rest = {}
    for i = taken + 1, #staged do
      rest[#rest + 1] = staged[i]
    end
    call_chunked('RPUSH', list, rest)
    return listed - took + #rest
  end
  retry_len = hand_out(retry, retry_len, staged_retry)
  ready_len = hand_out(ready, ready_len, staged_ready)
  set_aside(aside, now)
end

-- The deliveries of the fetcher's last request, handed out again (its reply was lost):
-- those still in unack under the lease it gave them, under new leases and deadlines; the
-- attempt was counted when they were first handed out. Any acked, refused or timed out
-- since are left alone.
local function hand_out_again(recorded)
  local ids, leases = {}, {}
  for i = 1, #recorded, 2 do
    table.insert(ids, recorded[i])
    table.insert(leases, tonumber(recorded[i + 1]))
  end
  local payload_of, raw = gather('HMGET', payloads, ids), gather('HMGET', metas, ids)
  local in_flight = gather('ZMSCORE', unack, ids)
  for i, id in ipairs(ids) do
    local lease, attempt, budget, due = parse_meta(raw[i])
    if holds(lease, leases[i]) and in_flight[i] and payload_of[i] then
      local _, _, body = unwrap(payload_of[i])
      lease_out(id, body, lease, attempt, budget, due)
    end
  end
  unack_moved = true
end

-- The fetcher's record of its last request (see KEYS[11]): false when there is none, a
-- table when the key holds another type (anyone's write; replaced like a record).
local record = false
local recorded = nil
if request ~= '' then
  record = redis.pcall('GET', record_key)
  local tag = cmsgpack.pack(request)
  if type(record) == 'string' and string.sub(record, 1, #tag) == tag then
    local _
    _, recorded = cmsgpack.unpack(record)
  end
end
-- Flow gates (issue #27: pause, RATE_LIMIT, MAX_IN_FLIGHT; see flow_gate in the prelude):
-- a new request takes no more than they allow (a repeat hands out what it took before).
local asked, flow_again, flow_rate, unreserved, cap_bound = count, nil, nil, 0, 0
if not recorded then
  count, flow_again, flow_rate, unreserved, cap_bound = flow_gate(count, now, args[6] or '',
    tonumber(args[7]) or 0, args[8] or '')
end
if recorded then
  hand_out_again(recorded)
else
  take_due()
end
-- Flow gates: log what went out; when the gates held messages back, those handed out are
-- due from now for the workers' lateness figures (the wait was the gates', not theirs).
flow_record(flow_rate, deliveries, handed, now)
if count < asked and handed == count then
  for i = 6, 6 * handed, 6 do
    deliveries[i] = math.max(deliveries[i], now)
  end
end
count = asked
call_chunked('HSET', metas, records)
call_chunked('ZADD', unack, leased)

-- Record what this request handed out (each delivery's id and lease), for a repeat of it;
-- a new request means the fetcher received the reply to its last one, whose record is
-- then of no more use.
if request ~= '' then
  if handed > 0 then
    local entries = {}
    for i = 0, handed - 1 do
      entries[2 * i + 1], entries[2 * i + 2] = deliveries[6 * i + 1], deliveries[6 * i + 4]
    end
    redis.call('SET', record_key, cmsgpack.pack(request, entries), 'PX', consume_ms)
  elseif record then
    redis.call('DEL', record_key)
  end
end

-- When to look again.
if unack_moved then
  unack_head = head_score(unack)
elseif handed > 0 and not (unack_head and unack_head < now + consume_ms) then
  unack_head = now + consume_ms
end
local next_ms = -1
local waiting = ready_len + retry_len > 0
if not (waiting or pending_read) then
  pending_head = head_score(pending)
end
if waiting or (pending_head and pending_head <= now) or (unack_head and unack_head <= now) then
  next_ms = now
  if count > 0 and handed == count and args[10] ~= '1' then
    wake(channel, now)
  end
end

-- Flow gates: work the gates held back waits for them, not for a worker (never a spin).
local capped = 0
if flow_again and next_ms == now then
  next_ms, capped = flow_again, cap_bound
end

-- An exhaustion to announce now, or a claim that lapses later (its announcer may be dead).
-- A quiet queue had no claim, and this call made none: it buries only deliveries that
-- timed out (unack was absent) and messages whose expiry passed (no expiry was kept).
local owed = 0
local exhausted_head = nil
if not quiet then
  exhausted_head = head_score(exhausted)
end
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

-- Whether what this call hands out may have an expiry, a postpone count or an ordered
-- group, which its ack must then clean up or pass on (see ack.lua's "untracked").
local tracked, groups = 0, {}
if handed > 0 and not options_unused() then
  if groups_used() then
    -- Each delivery's group, for the handler (Message.group).
    tracked = 1
    local ids = {}
    for i = 0, handed - 1 do
      ids[i + 1] = deliveries[6 * i + 1]
    end
    local group_of = group_names()
    for i, entry in ipairs(gather('HMGET', group_of, ids)) do
      local _, group = split_group(entry)
      groups[i] = group or false
    end
  elseif is_expiring() then
    tracked = 1
  end
end
return {now, next_ms, expired, deliveries, owed, now_us, tracked, groups, unreserved, capped,
  warnings}
