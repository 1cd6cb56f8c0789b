--[[
  release: hand back deliveries that were fetched but never started (a worker shutting
  down, or a local buffer held too long). No retry is used: the attempt is given back,
  and the messages go to the front of their staging list, in the order given.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, ready, retry, meta.
  ARGV[1]  wake-up channel
  ARGV[2]  n, then n pairs: id, lease

  Pairs whose lease does not match are ignored (see ack).
  Returns {released_ids, warnings}. Publishes now when anything was released.
]]

local channel, n = args[1], tonumber(args[2])
local released = {}
-- Walk backwards and push to the front, so the first id given ends up first.
for i = n - 1, 0, -1 do
  local id, token = args[3 + i * 2], tonumber(args[4 + i * 2])
  local lease, attempt, budget, due = read_meta(id)
  if holds(lease, token) and call('ZSCORE', unack, id) then
    call('ZREM', unack, id)
    write_meta(id, lease + 1, attempt - 1, budget, due)
    if attempt - 1 > 0 then
      call('LPUSH', retry, id)
    else
      call('LPUSH', ready, id)
    end
    table.insert(released, 1, id)
  end
end
if #released > 0 then
  wake(channel, now_ms())
end
return {released, warnings}
