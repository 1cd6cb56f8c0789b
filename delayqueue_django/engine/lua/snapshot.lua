--[[
  snapshot: every id the queue holds, read in one atomic step, for the invariant checker
  (read-only; delayqueue_django/engine/invariants.py does the checking, off the server).

  KEYS: the queue's key layout (see _prelude.lua); reads all of them.
  ARGV: none.

  Returns {pending, ready, unack, retry, garbage, payload_ids, metas, exhausted,
  quarantined, foreign, key_index, message_keys, history_ids, warnings}:
    pending … garbage  the ids in each state (lists in list order, zsets by score)
    payload_ids        the fields of the payload hash (the payloads themselves stay here)
    metas              the meta hash, flat: id, meta, id, meta, …; and the first record
                       made up for each message never handed out (see first_meta)
    exhausted          the ids whose exhaustion is still to be announced
    quarantined        the names of the keys renamed aside for holding the wrong type
                       (see KEYS[9]; an older version's single one is the key itself)
    foreign            the keys holding a type they should not (read as empty)
    key_index          the key index, flat: key, id, ... (its marker field left out; see
                       "Keys" in the prelude); empty when the queue never used keys
    message_keys       flat: id, key, ... for every stored keyed message (read only when
                       the queue used keys)
    history_ids        the ids that have attempt records (see "Attempt records" in the
                       prelude); empty when the records' key is absent or of another type

  Unlike every other script this one is not bounded: it reads the whole queue, O(n) for n
  messages, so Redis is busy for the read (see invariants.py for the cost). It only reads:
  it runs on a Redis that is out of memory, where MULTI is refused.
]]

local foreign = foreign_keys()

local function read(key, ...)
  if foreign[key] then
    return {}
  end
  return redis.call(...)
end

local foreign_list = {}
for key in pairs(foreign) do
  table.insert(foreign_list, key)
end
table.sort(foreign_list)

local quarantined = {}
local index = redis.call('TYPE', quarantine)['ok']
if index == 'zset' then
  quarantined = redis.call('ZRANGE', quarantine, 0, -1)
elseif index ~= 'none' then
  quarantined = {quarantine}
end

-- The messages never handed out (pending or ready) have no meta record: their first, made
-- up from what their payload carries, joins the others. Read once, for both answers.
local all_metas = read(metas, 'HGETALL', metas)
local waiting = {read(pending, 'ZRANGE', pending, 0, -1), read(ready, 'LRANGE', ready, 0, -1)}
if not foreign[metas] and not foreign[payloads] then
  local recorded, ids = {}, {}
  for i = 1, #all_metas, 2 do
    recorded[all_metas[i]] = true
  end
  for _, listed in ipairs(waiting) do
    for _, id in ipairs(listed) do
      if not recorded[id] then
        table.insert(ids, id)
      end
    end
  end
  for i, stored in ipairs(gather('HMGET', payloads, ids)) do
    local made = first_meta(stored)
    if made then
      table.insert(all_metas, ids[i])
      table.insert(all_metas, made)
    end
  end
end

-- The keys: the index, and every stored message's key, read from its payload one at a
-- time (only in a queue that used keys), so that Lua never holds them all.
local payload_ids = read(payloads, 'HKEYS', payloads)
local index, message_keys = {}, {}
if keys_used() and redis.call('TYPE', key_index)['ok'] == 'hash' and not foreign[payloads] then
  local flat = redis.call('HGETALL', key_index)
  for i = 1, #flat, 2 do
    if flat[i] ~= '' then
      table.insert(index, flat[i])
      table.insert(index, flat[i + 1])
    end
  end
  for _, id in ipairs(payload_ids) do
    local key = key_in(redis.call('HGET', payloads, id))
    if key then
      table.insert(message_keys, id)
      table.insert(message_keys, key)
    end
  end
end

local history_ids = {}
if redis.call('TYPE', histories)['ok'] == 'hash' then
  history_ids = redis.call('HKEYS', histories)
end

return {
  waiting[1],
  waiting[2],
  read(unack, 'ZRANGE', unack, 0, -1),
  read(retry, 'LRANGE', retry, 0, -1),
  read(garbage, 'ZRANGE', garbage, 0, -1),
  payload_ids,
  all_metas,
  read(exhausted, 'ZRANGE', exhausted, 0, -1),
  quarantined,
  foreign_list,
  index,
  message_keys,
  history_ids,
  warnings,
}
