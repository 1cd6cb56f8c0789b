--[[
  schedules: every schedule of the queue, as schedule.lua keeps them, read atomically.

  KEYS: the queue's key layout (see _prelude.lua), then KEYS[11] schedules and KEYS[12]
  schedule_ticks (see schedule.lua).
  ARGV: none.

  Returns {now, {name, definition, record, ...}, warnings}, by name; a definition or
  record that is missing reads as false. A key of the wrong type reads as empty, with a
  warning (schedule.lua renames it aside).
]]

local schedules, schedule_ticks = keys[11], keys[12]
local now = now_ms()

local function read(key)
  local found = {}
  local actual = redis.call('TYPE', key)['ok']
  if actual == 'hash' then
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
end
return {int(now), flat, warnings}
