--[[
  reschedule: give a waiting message (pending, or staged in ready or retry) a new due time,
  its attempt, budget and lease unchanged; an in-flight or dead message, or an unknown one,
  is left alone. One step, so a message is never both handed out and rescheduled.

  KEYS: the queue's key layout (see _prelude.lua); writes pending, ready, retry, payload or
        meta (where the message keeps its due time), and reads the key index.
  ARGV[1]  wake-up channel
  ARGV[2]  "id" or "key": what ARGV[3] names (a key names the key's message, see "Keys"
           in the prelude)
  ARGV[3]  the id or the key
  ARGV[4]  at_ms, or "" to use delay_us (as send's)
  ARGV[5]  delay_us (as send's)

  Returns {id, due_ms, warnings}: the message's id and its new due time, or "" and -1 when
  nothing waits under that id or key. A staged message goes back to pending; the due time
  it keeps (in its meta record if it has one, else at the start of its payload) follows.
  Publishes the new due time when it is earlier than every pending message's.
]]

local channel, by, name, at_ms, delay_us = args[1], args[2], args[3], args[4], args[5]
local id = name
if by == 'key' then
  id = keys_used() and call('HGET', key_index, name)
  if not id then
    return {'', -1, warnings}
  end
end
local now = now_ms()
local previous_head = head_score(pending)
if not call('ZSCORE', pending, id) and call('LREM', ready, 1, id) == 0
    and call('LREM', retry, 1, id) == 0 then
  return {'', -1, warnings}
end

local due
if at_ms ~= '' then
  due = math.max(tonumber(at_ms), now)
else
  due = due_after(now, delay_of(delay_us))
end
call('ZADD', pending, int(due), id)
local lease, attempt, budget = read_meta(id)
if lease then
  write_meta(id, lease, attempt, budget, due)
else
  local stored = call('HGET', payloads, id)
  local kept_budget, _, body = unwrap(stored or '')
  if kept_budget then
    call('HSET', payloads, id, wrap(kept_budget, due, body))
  end
end
if previous_head == nil or due < previous_head then
  wake(channel, due)
end
return {id, due, warnings}
