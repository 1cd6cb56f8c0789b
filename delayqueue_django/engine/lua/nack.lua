--[[
  nack: a batch of deliveries failed; schedule each for a retry after its delay, or
  bury it in garbage when its retries are used up.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, pending, garbage,
        meta, exhausted, throughput (each refusal counts as failed), payload and the key
        index (keyed messages, see "Keys" in the prelude);
  KEYS[11] the caller's record of its last request (only with a request id; see "Lost
           replies" in the prelude)
  ARGV[1]  wake-up channel
  ARGV[2]  request: this call's id ("": none, nothing recorded)
  ARGV[3]  record_ms: how long the record of the reply is kept
  ARGV[4]  n, then n triples: id, lease, delay_ms before the retry (-1: bury now,
          whatever retries are left); the retry's due time is rounded up to the ms, as
          send's, so that it is not handed out before the delay has passed
  then, optionally (Postpone, see "Expiry and postpones" in the prelude):
  ARGV[5+3n]  max_postpones: how often one message may be postponed
  ARGV[6+3n]  m, then m ids whose refusal is a postpone: its attempt is not counted (nor
              is it a failure) and it is never buried for its budget; the (max_postpones
              + 1)th postpone of a message buries it with the reason "postponed too often"
  A retry or postpone due at or after the message's expiry buries it with the reason
  "expired" instead.
  then, optionally (attempt records, see "Attempt records" in the prelude; the postpones'
  two arguments then come first, "0", "0" when there are none):
  ARGV[7+3n+m]  bound: the most records a message keeps (HISTORY_ATTEMPTS)
  ARGV[8+3n+m]  k, then k notes of 8: id, verdict, error class, error, traceback, worker,
                how long before this call the handler started (ms; "": not known), cut
                ("e" and/or "t"). A refusal that counts writes its note as the record of
                the attempt its delivery counted (a postpone's too), its verdict made
                "expired" or "postponed too often" when it buries the message for that
                reason; a superseded message is gone, and so are its records.

  A triple counts only if the message is still in unack under that lease (see ack).
  A repeat of the caller's last recorded request changes nothing and gets its reply.
  Returns {outcomes, warnings}; outcomes is a flat list of id, code, time:
    code 1 retry scheduled, time = its due time; code 2 exhausted, time = now;
    code 3 superseded, time = now: a keyed message whose key's message is another one,
    waiting, is removed instead of retried (see settle_keys in the prelude);
    code 4 expired, code 5 postponed too often, time = now: buried with that reason.
  Ids whose lease did not match are left out.
  Publishes the earliest retry time when it is earlier than every pending message's.
]]

local channel, request = args[1], args[2]
local record_ms, n = tonumber(args[3]), tonumber(args[4])
local replayed = recorded_reply(keys[11], request)
if replayed then
  return {replayed, warnings}
end
local now = now_ms()
local previous_head = head_score(pending)

-- One read of every meta record and unack score, one write per key (see "Batches" in
-- the prelude).
local ids = {}
for i = 1, n do
  ids[i] = args[2 + i * 3]
end
local raw, scores = gather('HMGET', metas, ids), gather('ZMSCORE', unack, ids)
-- Postpones (see the header): the ids, and the bound.
local max_postpones, postponing = tonumber(args[5 + 3 * n] or '0'), {}
local m = tonumber(args[6 + 3 * n] or '0')
for i = 7 + 3 * n, 6 + 3 * n + m do
  postponing[args[i]] = true
end
-- Attempt records (see the header): each refused id's note, by id.
local notes, bound = {}, tonumber(args[7 + 3 * n + m] or '0')
for i = 9 + 3 * n + m, #args, 8 do
  notes[args[i]] = i
end
-- The attempt each counted refusal's delivery counted, by id.
local attempts_of = {}
local postponed = {}
local earliest = nil
local outcomes, refused, done, records, to_bury, scored = {}, {}, {}, {}, {}, {}
-- The retries, their records and due times, and where their code is in outcomes: a keyed
-- one may yet be superseded (see below).
local retrying, retry_records, retry_dues, retry_codes = {}, {}, {}, {}
for i, id in ipairs(ids) do
  local token, delay_ms = tonumber(args[3 + i * 3]), tonumber(args[4 + i * 3])
  local lease, attempt, budget, due = parse_meta(raw[i])
  -- An id named twice counts once, like the first of its triples that holds: that one
  -- takes it out of unack, so no later triple could hold.
  if not done[id] and holds(lease, token) and scores[i] then
    done[id] = true
    table.insert(refused, id)
    attempts_of[id] = attempt
    if postponing[id] then
      -- Not an attempt: the one its delivery counted is given back.
      attempt = math.max(attempt - 1, 0)
      table.insert(postponed, id)
    end
    if (attempt > budget and not postponing[id]) or delay_ms < 0 then
      table.insert(records, id)
      table.insert(records, format_meta(lease + 1, attempt, budget, due))
      table.insert(to_bury, id)
      table.insert(outcomes, id)
      table.insert(outcomes, 2)
      table.insert(outcomes, now)
    else
      due = due_after(now, delay_ms, 0)
      table.insert(retrying, id)
      retry_records[#retrying] = format_meta(lease + 1, attempt, budget, due)
      retry_dues[#retrying] = due
      table.insert(outcomes, id)
      table.insert(outcomes, 1)
      table.insert(outcomes, due)
      retry_codes[#retrying] = #outcomes - 1
    end
  end
end

-- Postpones past the bound, and retries due at or after their expiry, are buried with
-- their reason (codes 5 and 4) instead of going back to waiting.
local too_often, postponed_back = {}, 0
for _, id in ipairs(postponed) do
  if call('HINCRBY', postpone_counts, id, 1) > max_postpones then
    too_often[id] = true
  else
    postponed_back = postponed_back + 1
  end
end
local past_expiry = {}
if #retrying > 0 and expiry_used() then
  past_expiry = expired_among(retrying, retry_dues)
end
local dead = {['expired'] = {}, ['postponed too often'] = {}}
local dead_ids = {}
local kept = {ids = {}, records = {}, dues = {}, codes = {}}
for i, id in ipairs(retrying) do
  if too_often[id] or past_expiry[id] then
    local reason = too_often[id] and 'postponed too often' or 'expired'
    table.insert(dead[reason], id)
    table.insert(dead_ids, id)
    outcomes[retry_codes[i]] = too_often[id] and 5 or 4
    outcomes[retry_codes[i] + 1] = now
    table.insert(records, id)
    table.insert(records, retry_records[i])
  else
    table.insert(kept.ids, id)
    kept.records[#kept.ids], kept.dues[#kept.ids] = retry_records[i], retry_dues[i]
    kept.codes[#kept.ids] = retry_codes[i]
  end
end
retrying, retry_records, retry_dues, retry_codes = kept.ids, kept.records, kept.dues, kept.codes

-- A keyed message goes back to waiting only if no other waiting message is its key's.
local superseded, gone = {}, {}
if #retrying > 0 and keys_used() then
  local moved = {}
  for _, buried in ipairs({to_bury, dead_ids}) do
    for _, id in ipairs(buried) do
      moved[id] = false
    end
  end
  superseded = settle_keys(retrying, gather('HMGET', payloads, retrying), moved)
end
for i, id in ipairs(retrying) do
  if superseded[id] then
    outcomes[retry_codes[i]], outcomes[retry_codes[i] + 1] = 3, now
    table.insert(gone, id)
  else
    local due = retry_dues[i]
    table.insert(records, id)
    table.insert(records, retry_records[i])
    table.insert(scored, int(due))
    table.insert(scored, id)
    if earliest == nil or due < earliest then
      earliest = due
    end
  end
end

-- The records of the attempts, before a superseded message's go with it.
if bound > 0 and next(notes) ~= nil then
  local entries, verdicts = {}, {}
  for reason, buried in pairs(dead) do
    for _, id in ipairs(buried) do
      verdicts[id] = reason
    end
  end
  for _, id in ipairs(refused) do
    local at = notes[id]
    if at then
      local ago = tonumber(args[at + 6])
      table.insert(entries, {id, {
        attempts_of[id], verdicts[id] or args[at + 1], args[at + 2], args[at + 3],
        args[at + 4], args[at + 5], ago and (now - ago) or cjson.null, now, args[at + 7],
      }})
    end
  end
  record_attempts(entries, bound)
end
call_chunked('ZREM', unack, refused)
call_chunked('HSET', metas, records)
bury(to_bury, now)
bury_for(dead['expired'], now, 'expired', 'expired')
bury_for(dead['postponed too often'], now, 'postponed too often', 'exhausted')
call_chunked('ZADD', pending, scored)
-- Ordered groups: a buried holder passes its group on (a retried one keeps it).
release_groups(to_bury, false)
remove_superseded(gone)
count_total('retried', #scored / 2)
if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
-- A postpone is no failure.
count_throughput(now, 'failed', #outcomes / 3 - postponed_back)
count_total('postponed', postponed_back)
record_reply(keys[11], request, outcomes, #outcomes, record_ms)
return {outcomes, warnings}
