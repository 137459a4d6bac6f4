-- jobfence Redis queue backend: renew the visibility of many deliveries in one call
-- (queue_lib.lua is prepended).
--
-- ARGV[3i - 2], ARGV[3i - 1], ARGV[3i]  (i = 1, 2, ...) receipt, consumer and the new
--         visibility in ms of delivery i
--
-- Returns a list with 1 for each delivery that is still its consumer's and whose deadline has
-- not passed (its deadline is now + visibility), and 0 for every other (left untouched: once
-- the deadline passed, the message may be delivered to another consumer at any moment, even
-- if nobody took it yet). Safe to re-send as it is: a renewed deadline is set again.

local now = now_ms()
local out = {}
for j = 1, #ARGV, 3 do
  local ok = 0
  local id = owned(ARGV[j], ARGV[j + 1])
  if id then
    local deadline = redis.call('ZSCORE', F, id)
    if deadline and tonumber(deadline) > now then
      redis.call('ZADD', F, 'XX', int(now + tonumber(ARGV[j + 2])), id)
      ok = 1
    end
  end
  out[#out + 1] = ok
end
return out
