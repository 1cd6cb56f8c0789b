--[[
  peek: where one message is and what it holds (read-only).

  KEYS: the queue's key layout (see _prelude.lua); reads all but quarantine.
  ARGV[1]  id
  ARGV[2]  optional preview_bytes: a payload longer than this is cut to at most this many
          bytes, on a UTF-8 character boundary (utf8_prefix), so that only those cross
          the wire (the admin's message page); absent, the whole payload

  Returns {state, score, payload, size, meta, unannounced, group, reason, warnings}:
    state        pending, ready, unack, retry, garbage, or "" if unknown
    score        due time, deadline or burial time in ms (-1 for ready and retry)
    payload      the JSON text (possibly cut), or false; size its whole length in bytes
                 (0 if missing); meta "lease:attempt:budget:due", or false
                 (a message never handed out, pending or ready, or dead by its expiry,
                 has its first made up from its payload: see made_up_meta)
    unannounced  1 if its exhaustion is still to be announced
    group        its ordered group, or false (a parked one's score is its due time)
    reason       a dead letter's reason when it is not the default ("expired", "postponed
                 too often"; see "Expiry and postpones" in the prelude), else ""
  A keyed message's payload keeps its key prefix whole before the cut payload (see
  preview in the prelude), and its size leaves the prefix out. (lookup.lua shares this.)
]]

return describe(args[1], tonumber(args[2]), foreign_keys())
