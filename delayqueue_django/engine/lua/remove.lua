--[[
  remove: take one message out of the queue for good.
    mode "cancel": only if it is waiting (pending, ready or retry), so that it will
                   never be delivered; an in-flight or dead message is left alone.
    mode "delete": from any state, garbage and unack included (an operator's action;
                   the in-flight delivery's ack then simply finds nothing).

  KEYS: the queue's key layout (see _prelude.lua); and the key index, which forgets a
        removed keyed message that still is its key's (see "Keys" in the prelude), and
        its expiry, postpone count and dead reason ("Expiry and postpones").
  ARGV[1]  id, or the key with ARGV[4] "key"
  ARGV[2]  mode, "cancel" or "delete"
  ARGV[3]  only from this state (optional, may be ""): the one an operator saw it in, so
           that a message that moved on meanwhile (requeued, handed out) is left alone
  ARGV[4]  optional "key": ARGV[1] is a key, and the message removed is the key's message
           (the one the key index names)
  ARGV[5]  optional "ended:<ms>:": keep an outcome record of it (see "Outcome records" in
           the prelude): cancelled, or for a dead letter expired or purged

  Returns {state, id, warnings}: the state it was removed from and its id, or "" and ""
  if nothing was removed.
  LREM on ready and retry is bounded: fetch keeps those lists short (stage_limit).
]]

local id, mode, only = args[1], args[2], args[3] or ''
local keyed = keys_used()
if args[4] == 'key' then
  id = keyed and call('HGET', key_index, args[1])
  if not id then
    return {'', '', warnings}
  end
end

local function from(state)
  return only == '' or only == state
end

keep_outcomes(args[5])
-- A dead letter's outcome is read before it leaves garbage (only when records are kept).
local dead_state, dead_at
if outcome_ms and mode == 'delete' and from('garbage') then
  dead_state, dead_at = dead_end(id)
end

local removed = ''
if from('pending') and call('ZREM', pending, id) == 1 then
  removed = 'pending'
elseif from('ready') and call('LREM', ready, 1, id) == 1 then
  removed = 'ready'
elseif from('retry') and call('LREM', retry, 1, id) == 1 then
  removed = 'retry'
elseif mode == 'delete' then
  if from('garbage') and call('ZREM', garbage, id) == 1 then
    removed = 'garbage'
  elseif from('unack') and call('ZREM', unack, id) == 1 then
    removed = 'unack'
  end
end
if removed == '' then
  return {'', '', warnings}
end
if removed == 'garbage' then
  record_ends({id}, dead_state, dead_at)
else
  record_ends({id}, 'cancelled')
end
if keyed then
  forget_keys({id}, {call('HGET', payloads, id)})
end
-- Ordered groups: a parked message leaves its group's queue; a holder passes it on.
if groups_used() then
  unpark(id)
  release_groups({id}, true)
end
call('HDEL', payloads, id)
call('HDEL', metas, id)
call('ZREM', exhausted, id)
forget_flow({id})
return {removed, id, warnings}
