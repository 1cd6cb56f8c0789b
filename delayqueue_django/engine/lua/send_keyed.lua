--[[
  send_keyed: schedule a batch of messages that each carry a key (the user's own name for
  the message, see "Keys" in _prelude.lua), at most one waiting message per key. Plain
  messages go through send.lua, which knows nothing of keys.

  KEYS: the queue's key layout (see _prelude.lua); writes pending, ready, retry, payload,
        meta (a replaced message's record), the key index and holds.
  ARGV[1]  wake-up channel
  ARGV[2]  n, the number of messages
  then, eight values per message:
    id          message id, new to the queue (as send's)
    at_ms       absolute due time in ms since the epoch, or "" to use delay_us (as send's)
    delay_us    delay in whole µs from the server's clock, rounded up to the ms (as send's)
    budget      retries allowed after the first delivery
    payload     JSON text (perhaps after the trace mark)
    key         the key: 1 to 256 bytes, any characters
    if_exists   what to do when the key's message waits: keep, replace or error
    unique_ms   how long the key stays held after this send creates a message (0: not)

  Each message is decided in order, seeing the earlier ones' effect:
    1. its id is stored with this key: a replay of a send whose reply was lost; nothing
       written, outcome created (with another key, or none: refused as send refuses it);
    2. else the key's message waits: keep leaves it; replace gives it this payload, due
       time and budget, attempt 0 (its meta record, if any, keeps its lease, so a verdict
       of an older delivery never matches) and a new generation; staged in ready or retry,
       it goes back to pending; error refuses the batch;
    3. else a hold on the key lasts: nothing written, outcome held (error refuses);
    4. else a new message with the key, which becomes the key's message; with unique_ms a
       hold on the key starts, until now + unique_ms (only here: a kept, held or replaced
       send never extends one).
  A message's generation is the server's ms when it was created or last replaced (a
  replace within the same ms adds 1), stored with its key at the start of its body.

  Returns {id, code, due_ms, ..., warnings}: per message the id the key names (the new
  one when created), code 1 created, 2 kept, 3 replaced, 4 held, and that message's due
  time, -1 when it is not waiting.
  Errors (nothing written): "DUPLICATE <id>" as send's; "DUPLICATE_KEY <n> <held> <id>":
  message n (from 1) of this call met the key's waiting message <id> (held 0) or a hold
  by <id> (held 1) with if_exists error.
  Publishes the earliest due time written when it is earlier than every pending message's.
]]

local channel, n = args[1], tonumber(args[2])
local now = now_ms()
local WIDTH = 8

local ids, message_keys = {}, {}
for i = 1, n do
  local base = 3 + (i - 1) * WIDTH
  ids[i], message_keys[i] = args[base], args[base + 5]
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
  return {generation = generation, lease = read_meta(id), staged = not call('ZSCORE', pending, id)}
end

local outcomes = {}
local function answer(id, code, due)
  table.insert(outcomes, id)
  table.insert(outcomes, code)
  table.insert(outcomes, due)
end

for i = 1, n do
  local base = 3 + (i - 1) * WIDTH
  local id, key, mode = ids[i], message_keys[i], args[base + 6]
  local function due()
    if args[base + 1] ~= '' then
      return math.max(tonumber(args[base + 1]), now)
    end
    return due_after(now, delay_of(args[base + 2]))
  end
  local holder = pointer[key]
  if holder == nil then
    holder = pointers[i]
  end
  if fresh[id] and fresh[id].key == key then
    answer(id, 1, fresh[id].due)
  elseif stored[i] and key_in(stored[i]) == key then
    answer(id, 1, due_if_waiting(id))
  elseif stored[i] or known[i] or fresh[id] then
    return redis.error_reply('DUPLICATE ' .. id)
  elseif holder and waiting(holder) then
    if mode == 'error' then
      return redis.error_reply('DUPLICATE_KEY ' .. i .. ' 0 ' .. holder)
    elseif mode == 'replace' then
      local entry = fresh[holder]
      if not entry then
        entry = load(holder)
        table.insert(order, holder)
        fresh[holder] = entry
      end
      entry.key, entry.generation = key, math.max(now, entry.generation + 1)
      entry.due, entry.budget, entry.payload = due(), tonumber(args[base + 3]), args[base + 4]
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
        return redis.error_reply('DUPLICATE_KEY ' .. i .. ' 1 ' .. hold)
      end
      answer(hold, 4, due_if_waiting(hold))
    else
      local unique_ms = tonumber(args[base + 7])
      fresh[id] = {key = key, generation = now, due = due(), budget = tonumber(args[base + 3]),
        payload = args[base + 4], created = true, unique_ms = unique_ms}
      table.insert(order, id)
      pointer[key] = id
      if unique_ms > 0 then
        held_by[key] = id
      end
      answer(id, 1, fresh[id].due)
    end
  end
end

-- Then the writes: each message in one ZADD and one HSET, the key index in one HSET.
local previous_head = head_score(pending)
local earliest = nil
local scored, bodies, records, index = {}, {}, {}, {'', '1'}
for _, id in ipairs(order) do
  local entry = fresh[id]
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
if #index > 2 then
  call_chunked('HSET', key_index, index)
end

if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
table.insert(outcomes, warnings)
return outcomes
