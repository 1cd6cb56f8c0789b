--[[
  list: one page of the messages in a state, in queue order (read-only). Ranges are
  bounded by `limit`, so a page costs the same with a million messages as with ten.

  KEYS: the queue's key layout (see _prelude.lua); reads the state's key, payload, meta,
        and a dead letter's reason and a message's group where the queue has them.
  ARGV[1]  state: pending, ready, unack, retry or garbage
  ARGV[2]  offset, ARGV[3] limit
  ARGV[4]  preview_bytes: payloads longer than this are cut to at most this many bytes,
          on a UTF-8 character boundary (utf8_prefix)

  Returns {entries, warnings}; entries is a flat list of
    id, score (due time, deadline or burial time in ms; -1 for the lists),
    payload (possibly cut; false if missing), payload size in bytes, meta (false if missing;
    made up for a message never handed out, as peek does), ordered group (false for none).
    A keyed message's payload keeps its key prefix whole before the cut payload, and its
    size leaves the prefix out.
]]

local state, offset, limit = args[1], tonumber(args[2]), tonumber(args[3])
local preview_bytes = tonumber(args[4])

local foreign = foreign_keys()
local key = ({pending = pending, ready = ready, unack = unack, retry = retry,
              garbage = garbage})[state]
local entries = {}
if key and not foreign[key] and limit > 0 then
  local ids, scores = {}, {}
  if key == ready or key == retry then
    ids = redis.call('LRANGE', key, offset, offset + limit - 1)
  else
    local flat = redis.call('ZRANGE', key, offset, offset + limit - 1, 'WITHSCORES')
    for i = 1, #flat, 2 do
      table.insert(ids, flat[i])
      scores[#ids] = tonumber(flat[i + 1])
      -- Ordered groups: a parked message (last in pending) shows its due time.
      if scores[#ids] >= PARKED then
        scores[#ids] = scores[#ids] - PARKED
      end
    end
  end
  -- Ordered groups: each message's group, read only on a queue that has had them.
  local group_of = group_names()
  local grouped = redis.call('TYPE', group_of)['ok'] == 'hash'
  for i, id in ipairs(ids) do
    local stored, payload = false, false
    local size = 0
    if not foreign[payloads] then
      stored = redis.call('HGET', payloads, id)
      if stored then
        local _, _, body = unwrap(stored)
        payload, size = preview(body, preview_bytes)
      end
    end
    local meta = false
    if not foreign[metas] then
      meta = redis.call('HGET', metas, id)
    end
    if not meta then
      meta = made_up_meta(state, state == 'garbage' and dead_reason_of(id) or '', stored)
    end
    local group = false
    if grouped then
      local _, named = split_group(redis.call('HGET', group_of, id))
      group = named or false
    end
    table.insert(entries, id)
    table.insert(entries, scores[i] or -1)
    table.insert(entries, payload)
    table.insert(entries, size)
    table.insert(entries, meta)
    table.insert(entries, group)
  end
end
return {entries, warnings}
