--[[
  drop_garbage: delete dead letters for good, oldest first, at most `limit` per call.
  Used for retention (older than a cutoff, keeping those whose exhaustion has not been
  announced yet) and for an operator's purge (everything).

  KEYS: the queue's key layout (see _prelude.lua); writes garbage, payload, meta, exhausted.
  ARGV[1]  older_than_ms: drop those buried at least this long ago, or -1 for all
  ARGV[2]  limit, the most ids examined in this call
  ARGV[3]  "1" to keep messages whose exhaustion is still unannounced, "0" to drop them too

  Returns {dropped, more, warnings}: how many were deleted, and 1 if another call may
  find more.
]]

local older_than_ms, limit, keep_unannounced = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
quarantine_foreign_keys()
local ids
if older_than_ms < 0 then
  ids = redis.call('ZRANGE', garbage, 0, limit - 1)
else
  local cutoff = now_ms() - older_than_ms
  ids = redis.call('ZRANGE', garbage, '-inf', int(cutoff), 'BYSCORE', 'LIMIT', 0, limit)
end
local dropped = 0
for _, id in ipairs(ids) do
  if not (keep_unannounced == '1' and redis.call('ZSCORE', exhausted, id)) then
    redis.call('ZREM', garbage, id)
    redis.call('ZREM', exhausted, id)
    redis.call('HDEL', payloads, id)
    redis.call('HDEL', metas, id)
    dropped = dropped + 1
  end
end
local more = 0
if #ids == limit and dropped > 0 then
  more = 1
end
return {dropped, more, warnings}
