--[[
  claim_exhausted: take up to `count` exhausted messages whose exhaustion has not been
  announced yet, for one worker to announce (send the message_exhausted signal). The
  claim lasts claim_ms: if the worker dies before confirming (confirm_exhausted), another
  worker claims them again, so every exhaustion is announced at least once.

  A claim is the score it gives the id in exhausted, the time it lapses: that score is
  also its token, which confirm_exhausted must present (an exhaustion claimed again, or a
  newer one of the same message, carries another score).

  KEYS: the queue's key layout (see _prelude.lua); writes exhausted.
  ARGV[1]  count
  ARGV[2]  claim_ms

  Returns {claims, warnings}; claims is a flat list: id, payload (false if lost),
  attempt, claimed_until (the token), reason (why it died: "" when its retries ran out or
  it was rejected, else its dead reason, such as "expired"; see "Expiry and postpones" in
  the prelude), group (its ordered group, false for none: a dead letter keeps its entry),
  for each claimed message.
]]

local count, claim_ms = tonumber(args[1]), tonumber(args[2])
local now = now_ms()
local claimed_until = int(now + claim_ms)
local claims = {}
local ids = call('ZRANGE', exhausted, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, count)
local group_of = #ids > 0 and groups_used() and group_names()
for _, id in ipairs(ids) do
  call('ZADD', exhausted, 'XX', claimed_until, id)
  local _, attempt = read_meta(id)
  table.insert(claims, id)
  local stored = call('HGET', payloads, id)
  if stored then
    local _, _, payload = unwrap(stored)
    table.insert(claims, payload)
  else
    table.insert(claims, false)
  end
  table.insert(claims, attempt or 0)
  table.insert(claims, claimed_until)
  table.insert(claims, call('HGET', dead_reasons, id) or '')
  local _, group = split_group(group_of and call('HGET', group_of, id))
  table.insert(claims, group or false)
end
return {claims, warnings}
