--[[
  peek: where one message is and what it holds (read-only).

  KEYS: the queue's key layout (see _prelude.lua); reads all but quarantine.
  ARGV[1]  id
  ARGV[2]  optional preview_bytes: a payload longer than this is cut to at most this many
          bytes, on a UTF-8 character boundary (utf8_prefix), so that only those cross
          the wire (the admin's message page); absent, the whole payload

  Returns {state, score, payload, size, meta, unannounced, warnings}:
    state        pending, ready, unack, retry, garbage, or "" if unknown
    score        due time, deadline or burial time in ms (-1 for ready and retry)
    payload      the JSON text (possibly cut), or false; size its whole length in bytes
                 (0 if missing); meta "lease:attempt:budget:due", or false
                 (a message never handed out, pending or ready, has its first made
                 up from its payload: see first_meta)
    unannounced  1 if its exhaustion is still to be announced
]]

local id = args[1]
local preview_bytes = tonumber(args[2])
local foreign = foreign_keys()
local state, score = '', -1
for _, entry in ipairs({{'pending', pending}, {'unack', unack}, {'garbage', garbage}}) do
  if state == '' and not foreign[entry[2]] then
    local found = redis.call('ZSCORE', entry[2], id)
    if found then
      state, score = entry[1], tonumber(found)
    end
  end
end
for _, entry in ipairs({{'ready', ready}, {'retry', retry}}) do
  if state == '' and not foreign[entry[2]] and redis.call('LPOS', entry[2], id) then
    state = entry[1]
  end
end
local stored, payload, size, meta, unannounced = false, false, 0, false, 0
if not foreign[payloads] then
  stored = redis.call('HGET', payloads, id)
end
if stored then
  local _, _, body = unwrap(stored)
  size = string.len(body)
  payload = preview_bytes and utf8_prefix(body, preview_bytes) or body
end
if not foreign[metas] then
  meta = redis.call('HGET', metas, id)
end
if not meta and (state == 'pending' or state == 'ready') then
  meta = first_meta(stored) or false
end
if not foreign[exhausted] and redis.call('ZSCORE', exhausted, id) then
  unannounced = 1
end
return {state, score, payload, size, meta, unannounced, warnings}
