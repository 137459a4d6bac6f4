-- jobfence Redis queue backend: give a delivery back without counting it (queue_lib.lua is
-- prepended). For a "not now" refusal: the handler did not run.
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
-- ARGV[2] receipt "<entry id>:<delivery>"
-- ARGV[3] consumer
-- ARGV[4] delay in ms (0: deliverable again at once)
--
-- As queue_nack.lua, except that the message is appended again with the deliveries before
-- this one (its next delivery has this delivery's number again) and keeps its last error.
-- Returns 1, or 0 if the delivery is not the consumer's (nothing changes).

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
local prior = math.max(tonumber(delivery) - 1, 0)
append(delay, now, fields['i'], fields['b'], fields['h'], int(prior), fields['t'],
  fields['e'] or false)
remember(call, '1', now)
return 1
