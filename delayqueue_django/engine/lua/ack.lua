--[[
  ack: a batch of deliveries succeeded; forget those messages.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, payload, meta, throughput,
        and the key index (an acked keyed message that still is its key's leaves it),
        expiries and postpone counts (see "Expiry and postpones" in the prelude), and
        attempt records (see "Attempt records" there);
  KEYS[11] the caller's record of its last request (only with a request id; see "Lost
           replies" in the prelude)
  ARGV[1]  request: this call's id ("": none, nothing recorded)
  ARGV[2]  record_ms: how long the record of the reply is kept
  ARGV[3]  n, then n pairs: id, lease (the token handed out by fetch)
  then, optionally, "plain": the caller knows that none of these messages was sent with a
          key (each delivery says so), so the key index is not looked at: an ack of
          plain messages costs what it did before keys existed; and "untracked": each was
          handed out by a fetch that found no expiry, postpone count nor ordered group in
          the queue (see fetch.lua), so those are not looked at either

  A pair counts only if the message is still in unack under that very lease: an ack
  from a delivery that timed out, was released or was already acked changes nothing.
  Both are read: the lease in the meta record and the unack entry. Within one life of an
  id every step that takes a delivery out of unack bumps its lease or deletes the record,
  but an id can live again (a send replayed after its message was handled, a requeue of a
  damaged record), its leases counting from the start once more: a token of the earlier
  life may then equal the lease of a message that waits in pending or retry, and only the
  unack entry tells that it is not in flight.
  A repeat of the caller's last recorded request changes nothing and gets its reply.
  Returns {acked_ids, warnings}.
]]

local request, record_ms, n = args[1], tonumber(args[2]), tonumber(args[3])
local now = now_ms()

-- One read of every meta record and unack score, one write per key (see "Batches" in
-- the prelude).
local ids = {}
for i = 1, n do
  ids[i] = args[2 + i * 2]
end
local raw, scores = gather('HMGET', metas, ids), gather('ZMSCORE', unack, ids)
local acked, done, retried = {}, {}, {}
for i, id in ipairs(ids) do
  local token = tonumber(args[3 + i * 2])
  local lease, attempt = parse_meta(raw[i])
  -- An id named twice counts once, like the first of its pairs that holds: once acked,
  -- its meta record and unack entry are gone, so no later pair could hold.
  if not done[id] and holds(lease, token) and scores[i] then
    done[id] = true
    table.insert(acked, id)
    -- Only a message past its first attempt may have attempt records (a postponed one,
    -- whose attempt was given back, is tracked: see below).
    if attempt > 1 then
      table.insert(retried, id)
    end
  end
end
-- A repeat of the caller's last recorded request (see "Lost replies" in the prelude) is
-- answered from its record, before anything is written. One that acks something records
-- its reply and reads the record it replaces in one command (see swap_reply).
local replayed
if #acked == 0 then
  replayed = recorded_reply(keys[11], request)
else
  replayed = swap_reply(keys[11], request, acked, record_ms)
end
if replayed then
  return {replayed, warnings}
end
local flags = {}
for i = 4 + 2 * n, #args do
  flags[args[i]] = true
end
if #acked > 0 and not flags.plain and keys_used() then
  forget_keys(acked, gather('HMGET', payloads, acked))
end
call_chunked('ZREM', unack, acked)
call_chunked('HDEL', payloads, acked)
call_chunked('HDEL', metas, acked)
if not flags.untracked then
  -- (Its attempt records too: see "Attempt records" in the prelude.)
  forget_flow(acked)
  -- Ordered groups: an acked holder passes its group on.
  release_groups(acked, true)
else
  -- A message that never failed has no attempt records: its ack costs nothing more.
  call_chunked('HDEL', histories, retried)
end
count_throughput(now, 'acked', #acked)
return {acked, warnings}
