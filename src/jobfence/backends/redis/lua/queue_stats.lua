-- jobfence Redis queue backend: message counts by state (read-only; queue_lib.lua is
-- prepended).
--
-- Returns {ready, delayed, in_flight, dead}. Delayed messages already due but not yet moved
-- into the stream (a receive moves them) count as ready.

local now = now_ms()
local in_flight = redis.call('ZCARD', F)
local due = redis.call('ZCOUNT', D, '-inf', int(now))
local ready = math.max(0, redis.call('XLEN', S) - in_flight) + due
return {ready, redis.call('ZCARD', D) - due, in_flight, redis.call('XLEN', DEAD)}
