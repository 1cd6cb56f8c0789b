--[[
  claim_exhausted: take up to `count` exhausted messages whose exhaustion has not been
  announced yet, for one worker to announce (send the message_exhausted signal). The
  claim lasts claim_ms: if the worker dies before confirming (ZREM from exhausted),
  another worker claims them again, so every exhaustion is announced at least once.

  KEYS: the queue's key layout (see _prelude.lua); writes exhausted.
  ARGV[1]  count
  ARGV[2]  claim_ms

  Returns {claims, warnings}; claims is a flat list: id, payload (false if lost),
  attempt, for each claimed message.
]]

local count, claim_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
quarantine_foreign_keys()
local now = now_ms()
local claims = {}
local ids = redis.call('ZRANGE', exhausted, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, count)
for _, id in ipairs(ids) do
  redis.call('ZADD', exhausted, 'XX', int(now + claim_ms), id)
  local _, attempt = read_meta(id)
  table.insert(claims, id)
  table.insert(claims, redis.call('HGET', payloads, id))
  table.insert(claims, attempt or 0)
end
return {claims, warnings}
