-- jobfence Redis queue backend: move a delivered message to the dead letters (queue_lib.lua
-- is prepended).
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
-- ARGV[2] receipt "<entry id>:<delivery>"
-- ARGV[3] consumer
-- ARGV[4] the most dead letters to keep (0: no limit; beyond it the oldest are trimmed)
-- ARGV[5] the error to record; absent: none
--
-- If the delivery is still the consumer's, its entry leaves the stream and the message is
-- appended to :dead with its delivery count (n), the error (e) and the time (x). Returns 1,
-- or 0 if the delivery is not the consumer's (nothing changes).

local call, receipt, consumer, keep = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if recall(call) then
  return 1
end
local id, delivery = owned(receipt, consumer)
if not id then
  return 0
end
local fields = entry_fields(id)
finish(id)
if not fields then  -- the entry was deleted by hand
  return 0
end
local now = now_ms()
local dead = {'i', fields['i'], 'b', fields['b'], 'h', fields['h'], 'n', delivery,
  't', fields['t'], 'x', int(now)}
if ARGV[5] then
  dead[#dead + 1] = 'e'
  dead[#dead + 1] = ARGV[5]
end
if keep > 0 then
  redis.call('XADD', DEAD, 'MAXLEN', int(keep), '*', unpack(dead))
else
  redis.call('XADD', DEAD, '*', unpack(dead))
end
remember(call, '1', now)
return 1
