-- jobfence Redis queue backend: give a delivery back (queue_lib.lua is prepended).
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
-- ARGV[2] receipt "<entry id>:<delivery>"
-- ARGV[3] consumer
-- ARGV[4] delay in ms (0: deliverable again at once)
-- ARGV[5] the error to record as the message's last error; absent: none
--
-- If the delivery is still the consumer's, its entry leaves the stream and the message is
-- appended again -- to the stream's end, or to the delayed messages -- carrying its
-- delivery count (the next delivery is + 1), its published_at and the error. Returns 1, or 0
-- if the delivery is not the consumer's (nothing changes).

local call, receipt, consumer, delay = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
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
append(delay, now, fields['i'], fields['b'], fields['h'], delivery, fields['t'], ARGV[5] or false)
remember(call, '1', now)
return 1
