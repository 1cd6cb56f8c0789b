--[[
  release: hand back deliveries that were fetched but never started (a worker shutting
  down, or a local buffer held too long). No retry is used: the attempt is given back,
  and the messages go to the front of their staging list, in the order given.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, ready, retry, meta, and
        payload and the key index (keyed messages, see "Keys" in the prelude).
  ARGV[1]  wake-up channel
  ARGV[2]  n, then n pairs: id, lease
  ARGV[3+2n] optional "ended:<ms>:": keep an outcome record of each superseded message
             (see "Outcome records" in the prelude)

  Pairs whose lease does not match are ignored (see ack). A keyed message whose key's
  message is another one, waiting, is superseded: removed, not handed back (see
  settle_keys in the prelude).
  Returns {released_ids, warnings}. Publishes now when anything was released.
]]

local channel, n = args[1], tonumber(args[2])
keep_outcomes(args[3 + 2 * n])
-- Walk backwards, so that pushing each to the front leaves the first id given first.
local matched, records = {}, {}
for i = n - 1, 0, -1 do
  local id, token = args[3 + i * 2], tonumber(args[4 + i * 2])
  local lease, attempt, budget, due = read_meta(id)
  if not records[id] and holds(lease, token) and call('ZSCORE', unack, id) then
    table.insert(matched, id)
    records[id] = {lease, attempt, budget, due}
  end
end
local superseded, gone = {}, {}
if #matched > 0 and keys_used() then
  superseded = settle_keys(matched, gather('HMGET', payloads, matched), {})
end
local released = {}
for _, id in ipairs(matched) do
  local lease, attempt, budget, due = unpack(records[id])
  call('ZREM', unack, id)
  if superseded[id] then
    table.insert(gone, id)
  else
    write_meta(id, lease + 1, attempt - 1, budget, due)
    if attempt - 1 > 0 then
      call('LPUSH', retry, id)
    else
      call('LPUSH', ready, id)
    end
    table.insert(released, 1, id)
  end
end
remove_superseded(gone)
if #released > 0 then
  wake(channel, now_ms())
end
return {released, warnings}
