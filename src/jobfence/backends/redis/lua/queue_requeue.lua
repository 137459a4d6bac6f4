-- jobfence Redis queue backend: publish dead letters again, one page at a time
-- (queue_lib.lua is prepended).
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
-- ARGV[2] the most dead letters to look at in this call
-- ARGV[3] where to start in :dead: "-" (the oldest), or "(<entry id>" (after that entry)
-- ARGV[4...] the message ids to requeue; none: every dead letter
--
-- Each dead letter looked at that is requeued leaves :dead and is appended to the stream as
-- a new message (delivery count 0, so its next delivery is 1; no last error; published now).
-- Returns {how many were requeued, the last entry id looked at ("" when the end was reached)}.

local call, page, start = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local done = recall(call)
if done then
  local count, last = string.match(done, '^(%d+) (.*)$')
  return {tonumber(count), last}
end
local wanted = nil
if #ARGV > 3 then
  wanted = {}
  for j = 4, #ARGV do
    wanted[ARGV[j]] = true
  end
end
local now = now_ms()
local entries = redis.call('XRANGE', DEAD, start, '+', 'COUNT', page)
local count = 0
for _, entry in ipairs(entries) do
  local fields = field_map(entry[2])
  if not wanted or wanted[fields['i']] then
    append(0, now, fields['i'], fields['b'], fields['h'], '0', int(now), false)
    redis.call('XDEL', DEAD, entry[1])
    count = count + 1
  end
end
local last = ''
if #entries == page then
  last = entries[#entries][1]
end
remember(call, int(count) .. ' ' .. last, now)
return {count, last}
