--[[
  send_keyed: schedule a batch of messages that each carry a key (the user's own name for
  the message, see "Keys" in _prelude.lua), at most one waiting message per key. Plain
  messages go through send.lua, which knows nothing of keys.

  KEYS: the queue's key layout (see _prelude.lua); writes pending, ready, retry, payload,
        meta (a replaced message's record), the key index and holds, and the metrics
        history (the messages created or replaced count as sent).
  ARGV[1]  wake-up channel
  ARGV[2]  n, the number of messages
  then, eight values per message:
    id          message id, new to the queue (as send's)
    at_ms       absolute due time in ms since the epoch, or "" to use delay_us (as send's)
    delay_us    delay in whole µs from the server's clock, rounded up to the ms (as send's)
    budget      retries allowed after the first delivery
    payload     JSON text (perhaps after the trace mark)
    key         the key: 1 to 256 bytes, any characters
    if_exists   what to do when the key's message waits: keep, replace or error
    unique_ms   how long the key stays held after this send creates a message (0: not)
  then m, the number of grouped messages among them, and m pairs: index (1-based, in the
  batch), group (see "Ordered groups" in the prelude): a message created joins its group,
  one replaced leaves the group it had and joins this one (see regroup in the prelude)
  then, optionally, the batch's expiries, as send's (see send.lua): a message created or
  replaced gets its expiry, or loses the one it had (a replace without one)

  Each message is decided in order, seeing the earlier ones' effect, by the prelude's
  send_keys (which lists the rules: a replay, the key's waiting message kept, replaced or
  refused, a hold, or a new message that becomes the key's).

  Returns {id, code, due_ms, ..., warnings}: per message the id the key names (the new
  one when created), code 1 created, 2 kept, 3 replaced, 4 held, and that message's due
  time, -1 when it is not waiting.
  Errors (nothing written): "DUPLICATE <id>" as send's; "DUPLICATE_KEY <n> <held> <id>":
  message n (from 1) of this call met the key's waiting message <id> (held 0) or a hold
  by <id> (held 1) with if_exists error; "EXPIRES_BEFORE_DUE <id>" as send's.
  Publishes the earliest due time written when it is earlier than every pending message's.
]]

local channel, n = args[1], tonumber(args[2])
local now = now_ms()
local WIDTH = 8

local items = {}
for i = 1, n do
  local base = 3 + (i - 1) * WIDTH
  local due
  if args[base + 1] ~= '' then
    due = math.max(tonumber(args[base + 1]), now)
  else
    due = due_after(now, delay_of(args[base + 2]))
  end
  items[i] = {id = args[base], key = args[base + 5], mode = args[base + 6], due = due,
    budget = tonumber(args[base + 3]), payload = args[base + 4],
    unique_ms = tonumber(args[base + 7])}
end

-- (The groups' count and pairs come first, then the expiries: see the header.)
local grouped = tonumber(args[3 + n * WIDTH]) or 0
for j = 0, grouped - 1 do
  items[tonumber(args[4 + n * WIDTH + j * 2])].group = args[5 + n * WIDTH + j * 2]
end
local expiring = read_expiries(args, 4 + n * WIDTH + grouped * 2, now)
for i, item in ipairs(items) do
  if expiring[i] and expiring[i] <= item.due then
    return redis.error_reply('EXPIRES_BEFORE_DUE ' .. item.id)
  end
end

local previous_head = head_score(pending)
local outcomes, earliest, refusal = send_keys(items, now)
if refusal then
  return redis.error_reply(refusal)
end
-- Expiries of the messages created (code 1) or replaced (code 3); a replace without one
-- drops the expiry the replaced message had.
local expiry_scored, unexpiring, sent = {}, {}, 0
for i = 1, n do
  local id, code = outcomes[3 * i - 2], outcomes[3 * i - 1]
  if code == 1 or code == 3 then
    sent = sent + 1
    if expiring[i] then
      table.insert(expiry_scored, int(expiring[i]))
      table.insert(expiry_scored, id)
    elseif code == 3 then
      table.insert(unexpiring, id)
    end
  end
end
call_chunked('ZADD', expiries, expiry_scored)
if #unexpiring > 0 and expiry_used() then
  call_chunked('ZREM', expiries, unexpiring)
end
if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
-- The metrics history: a message created or replaced was sent (one kept or held was not).
count_minute(now, {SENT, sent})
table.insert(outcomes, warnings)
return outcomes
