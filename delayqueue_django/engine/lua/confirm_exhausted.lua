--[[
  confirm_exhausted: record that claimed exhaustions were announced. Each id leaves
  exhausted only while it still holds the very claim given (its score is the claim's
  token, see claim_exhausted): a confirm arriving after the claim lapsed and another
  worker claimed it again, or after the message was requeued and exhausted anew, leaves
  that newer entry to be announced.

  KEYS: the queue's key layout (see _prelude.lua); writes exhausted.
  ARGV[1]  n, then n pairs: id, claimed_until (the token claim_exhausted returned)

  Returns {confirmed, warnings}: how many ids left exhausted.
]]

local n = tonumber(args[1])
local ids = {}
for i = 1, n do
  ids[i] = args[2 * i]
end
local scores = gather('ZMSCORE', exhausted, ids)
local confirmed, done = {}, {}
for i, id in ipairs(ids) do
  -- An id named twice counts once.
  if not done[id] and scores[i] and tonumber(scores[i]) == tonumber(args[2 * i + 1]) then
    done[id] = true
    table.insert(confirmed, id)
  end
end
call_chunked('ZREM', exhausted, confirmed)
return {#confirmed, warnings}
