-- jobfence Redis queue backend: publish a batch of messages (queue_lib.lua is prepended).
--
-- ARGV[1] call id (random per call; a re-send publishes nothing again)
-- ARGV[2] delay in ms (0: ready at once)
-- ARGV[3i], ARGV[3i + 1], ARGV[3i + 2]  (i = 1, 2, ...) id, body and headers (JSON) of
--         message i, in publish order
--
-- Ready messages are appended to the stream (XADD wakes the consumers waiting on it); delayed
-- ones to the delayed stream, indexed by their due time in :d. Returns how many.

local call, delay = ARGV[1], tonumber(ARGV[2])
local done = recall(call)
if done then
  return tonumber(done)
end
local now = now_ms()
local count = 0
for j = 3, #ARGV, 3 do
  append(delay, now, ARGV[j], ARGV[j + 1], ARGV[j + 2], '0', int(now), false)
  count = count + 1
end
remember(call, int(count), now)
return count
