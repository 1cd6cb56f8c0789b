--[[
  ack: a batch of deliveries succeeded; forget those messages.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, payload, meta, throughput.
  ARGV[1]  n, then n pairs: id, lease (the token handed out by fetch)

  A pair counts only if the message is still in unack under that very lease: an ack
  from a delivery that timed out, was released or was already acked changes nothing.
  Returns {acked_ids, warnings}.
]]

local n = tonumber(ARGV[1])
quarantine_foreign_keys()
local now = now_ms()

-- One read of every meta record and unack score, one write per key (see "Batches" in
-- the prelude).
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[2 + i * 2]
end
local raw, scores = gather('HMGET', metas, ids), gather('ZMSCORE', unack, ids)
local acked, done = {}, {}
for i, id in ipairs(ids) do
  local token = tonumber(ARGV[1 + i * 2])
  local lease = parse_meta(raw[i])
  -- An id named twice counts once, like the first of its pairs that holds: once acked,
  -- its meta record and unack entry are gone, so no later pair could hold.
  if not done[id] and holds(lease, token) and scores[i] then
    done[id] = true
    table.insert(acked, id)
  end
end
call_chunked('ZREM', unack, acked)
call_chunked('HDEL', payloads, acked)
call_chunked('HDEL', metas, acked)
count_throughput(now, 'acked', #acked)
return {acked, warnings}
