--[[
  extend: push the redelivery deadline of deliveries still being worked on to
  now + consume_ms (a long handler's heartbeat, or a batch just taken from a buffer).

  KEYS: the queue's key layout (see _prelude.lua); writes unack.
  ARGV[1]  consume_ms
  ARGV[2]  n, then n pairs: id, lease

  Pairs whose lease does not match are ignored (see ack): a delivery that already
  timed out cannot be revived.
  Returns {deadline_ms, extended_ids, warnings}.
]]

local consume_ms, n = tonumber(args[1]), tonumber(args[2])
local deadline = now_ms() + consume_ms
local extended = {}
for i = 0, n - 1 do
  local id, token = args[3 + i * 2], tonumber(args[4 + i * 2])
  local lease = read_meta(id)
  if holds(lease, token) and call('ZSCORE', unack, id) then
    call('ZADD', unack, 'XX', int(deadline), id)
    table.insert(extended, id)
  end
end
return {deadline, extended, warnings}
