--[[
  snapshot: every id the queue holds, read in one atomic step, for the invariant checker
  (read-only; delayqueue_django/engine/invariants.py does the checking, off the server).

  KEYS: the queue's key layout (see _prelude.lua); reads all of them.
  ARGV: none.

  Returns {pending, ready, unack, retry, garbage, payload_ids, metas, exhausted,
  quarantined, foreign, warnings}:
    pending … garbage  the ids in each state (lists in list order, zsets by score)
    payload_ids        the fields of the payload hash (the payloads themselves stay here)
    metas              the meta hash, flat: id, meta, id, meta, …
    exhausted          the ids whose exhaustion is still to be announced
    quarantined        1 if the quarantine key exists (a key was renamed aside once)
    foreign            the keys holding a type they should not (read as empty)

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

return {
  read(pending, 'ZRANGE', pending, 0, -1),
  read(ready, 'LRANGE', ready, 0, -1),
  read(unack, 'ZRANGE', unack, 0, -1),
  read(retry, 'LRANGE', retry, 0, -1),
  read(garbage, 'ZRANGE', garbage, 0, -1),
  read(payloads, 'HKEYS', payloads),
  read(metas, 'HGETALL', metas),
  read(exhausted, 'ZRANGE', exhausted, 0, -1),
  redis.call('EXISTS', quarantine),
  foreign_list,
  warnings,
}
