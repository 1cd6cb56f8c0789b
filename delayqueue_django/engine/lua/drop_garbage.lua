--[[
  drop_garbage: delete dead letters for good, oldest first, examining at most `limit` per
  call. Used for retention (older than a cutoff, keeping those whose exhaustion has not been
  announced yet) and for an operator's purge (everything).

  The ones kept stay where they are, oldest first: a caller going on past them skips them
  with `offset` (how many earlier calls kept), so that any number of unannounced dead
  letters never hides the announced ones behind them.

  KEYS: the queue's key layout (see _prelude.lua); writes garbage, payload, meta, exhausted,
        and the key index (a dropped keyed message that still is its key's leaves it),
        with its dead reason (see "Expiry and postpones" in the prelude).
  ARGV[1]  older_than_ms: drop those buried at least this long ago, or -1 for all
  ARGV[2]  limit, the most ids examined in this call
  ARGV[3]  "1" to keep messages whose exhaustion is still unannounced, "0" to drop them too
  ARGV[4]  offset: how many of the oldest candidates to pass over (kept by earlier calls)
  ARGV[5]  buried_before_ms: instead of older_than_ms, drop only those buried before this
           time (Redis clock, ms), or -1: a purge of the dead letters an operator was shown
  ARGV[6]  optional "ended:<ms>:": keep an outcome record of each dropped, expired or
           purged (see "Outcome records" in the prelude)

  Returns {dropped, kept, warnings}: how many were deleted, and how many examined were
  kept. Fewer than `limit` examined in all means there are no more candidates.
]]

local older_than_ms, limit, keep_unannounced = tonumber(args[1]), tonumber(args[2]), args[3]
local offset, buried_before = tonumber(args[4]), tonumber(args[5] or '-1')
-- The latest burial time dropped (garbage is scored by it): before the time shown, up to
-- the cutoff, or any.
local upto = '+inf'
if buried_before >= 0 then
  upto = '(' .. int(buried_before)
elseif older_than_ms >= 0 then
  upto = int(now_ms() - older_than_ms)
end
keep_outcomes(args[6])
local ids = call('ZRANGE', garbage, '-inf', upto, 'BYSCORE', 'LIMIT', offset, limit)
local dropped = 0
local keyed = #ids > 0 and keys_used()
local grouped = #ids > 0 and groups_used()
for _, id in ipairs(ids) do
  if not (keep_unannounced == '1' and call('ZSCORE', exhausted, id)) then
    if outcome_ms then
      record_ends({id}, dead_end(id))
    end
    if keyed then
      forget_keys({id}, {call('HGET', payloads, id)})
    end
    call('ZREM', garbage, id)
    call('ZREM', exhausted, id)
    call('HDEL', payloads, id)
    call('HDEL', metas, id)
    if grouped then
      release_groups({id}, true)
    end
    forget_flow({id})
    dropped = dropped + 1
  end
end
return {dropped, #ids - dropped, warnings}
