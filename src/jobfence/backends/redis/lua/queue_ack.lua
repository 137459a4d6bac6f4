-- jobfence Redis queue backend: acknowledge a delivery (queue_lib.lua is prepended).
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
-- ARGV[2] receipt "<entry id>:<delivery>"
-- ARGV[3] consumer
--
-- Returns 1 and removes the message (XACK, XDEL: the stream keeps only live messages) if the
-- delivery is still the consumer's; else 0 and nothing changes (its visibility passed and
-- another consumer received the message since, or it was already finished).

local call, receipt, consumer = ARGV[1], ARGV[2], ARGV[3]
if recall(call) then
  return 1
end
local id = owned(receipt, consumer)
if not id then
  return 0
end
finish(id)
remember(call, '1', now_ms())
return 1
