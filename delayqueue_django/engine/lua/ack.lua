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
local acked = {}
for i = 0, n - 1 do
  local id, token = ARGV[2 + i * 2], tonumber(ARGV[3 + i * 2])
  local lease = read_meta(id)
  if lease == token and redis.call('ZSCORE', unack, id) then
    redis.call('ZREM', unack, id)
    redis.call('HDEL', payloads, id)
    redis.call('HDEL', metas, id)
    table.insert(acked, id)
  end
end
count_throughput(now, 'acked', #acked)
return {acked, warnings}
