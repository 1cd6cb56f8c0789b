--[[
  schedules: every schedule of the queue, as schedule.lua keeps them, read atomically; or
  one of them.

  KEYS: the queue's key layout (see _prelude.lua), then KEYS[11] schedules, KEYS[12]
  schedule_ticks and KEYS[13] schedule_failures (see schedule.lua); KEYS[14]
  schedule_declared, given as to schedule.lua, is not read.
  ARGV[1]  name (optional): only that schedule (a worker handing out one of its ticks
           reads it so: one field of each hash, not every schedule of the queue)

  Returns {now, {name, definition, record, failure, ...}, warnings}, by name; a
  definition, record or failure that is missing reads as false (a failure without either
  of the others is not listed). A key of the wrong type reads as empty, with a
  warning (schedule.lua renames it aside).
]]

local schedules, schedule_ticks, schedule_failures = keys[11], keys[12], keys[13]
local only = args[1]
local now = now_ms()

local function read(key)
  local found = {}
  local actual = redis.call('TYPE', key)['ok']
  if actual == 'hash' and only then
    found[only] = redis.call('HGET', key, only) or nil
  elseif actual == 'hash' then
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
      found[flat[i]] = flat[i + 1]
    end
  elseif actual ~= 'none' then
    table.insert(warnings, {key, 'holds a ' .. actual .. ' instead of a hash'})
  end
  return found
end

local definitions, records = read(schedules), read(schedule_ticks)
local failures = read(schedule_failures)
local names = {}
for name in pairs(definitions) do
  table.insert(names, name)
end
for name in pairs(records) do
  if not definitions[name] then
    table.insert(names, name)
  end
end
table.sort(names)

local flat = {}
for _, name in ipairs(names) do
  table.insert(flat, name)
  table.insert(flat, definitions[name] or false)
  table.insert(flat, records[name] or false)
  table.insert(flat, failures[name] or false)
end
return {int(now), flat, warnings}
