-- jobfence Redis queue backend: delete every message of the queue (queue_lib.lua is
-- prepended).
--
-- ARGV[1] call id (random per call; a re-send answers as the first send did)
--
-- Deletes the stream (with its group: the next call creates both again), the in-flight
-- records, the delayed and the dead messages. Returns how many messages there were (ready,
-- in flight, delayed and dead). Deliveries in flight are gone: their ack, nack, renew and
-- dead_letter return 0.

local call = ARGV[1]
local done = recall(call)
if done then
  return tonumber(done)
end
local count = redis.call('XLEN', S) + redis.call('ZCARD', D) + redis.call('XLEN', DEAD)
redis.call('DEL', S, F, O, D, DS, DEAD)
remember(call, int(count), now_ms())
return count
