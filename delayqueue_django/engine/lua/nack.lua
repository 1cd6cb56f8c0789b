--[[
  nack: a batch of deliveries failed; schedule each for a retry after its delay, or
  bury it in garbage when its retries are used up.

  KEYS: the queue's key layout (see _prelude.lua); writes unack, pending, garbage,
        meta, exhausted, throughput (each refusal counts as failed).
  ARGV[1]  wake-up channel
  ARGV[2]  n, then n triples: id, lease, delay_ms before the retry (-1: bury now,
          whatever retries are left)

  A triple counts only if the message is still in unack under that lease (see ack).
  Returns {outcomes, warnings}; outcomes is a flat list of id, code, time:
    code 1 retry scheduled, time = its due time; code 2 exhausted, time = now.
  Ids whose lease did not match are left out.
  Publishes the earliest retry time when it is earlier than every pending message's.
]]

local channel, n = ARGV[1], tonumber(ARGV[2])
quarantine_foreign_keys()
local now = now_ms()
local previous_head = head_score(pending)
local earliest = nil
local outcomes = {}
for i = 0, n - 1 do
  local base = 3 + i * 3
  local id, token, delay_ms = ARGV[base], tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local lease, attempt, budget, due = read_meta(id)
  if lease == token and redis.call('ZSCORE', unack, id) then
    redis.call('ZREM', unack, id)
    if attempt > budget or delay_ms < 0 then
      write_meta(id, lease + 1, attempt, budget, due)
      bury({id}, now)
      table.insert(outcomes, id)
      table.insert(outcomes, 2)
      table.insert(outcomes, now)
    else
      due = now + delay_ms
      write_meta(id, lease + 1, attempt, budget, due)
      redis.call('ZADD', pending, int(due), id)
      count_total('retried', 1)
      if earliest == nil or due < earliest then
        earliest = due
      end
      table.insert(outcomes, id)
      table.insert(outcomes, 1)
      table.insert(outcomes, due)
    end
  end
end
if earliest ~= nil and (previous_head == nil or earliest < previous_head) then
  wake(channel, earliest)
end
count_throughput(now, 'failed', #outcomes / 3)
return {outcomes, warnings}
